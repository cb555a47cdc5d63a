#!/usr/bin/env python3
"""Independent reference forward pass for GGUF llama, qwen2 and gemma3 models, in numpy.

Reads the GGUF itself (no code shared with the C++ engine), dequantizes
F32/F16/Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K, and runs a plain causal forward pass over the given
token ids, printing the last token's logits, one per line. qwen2 adds Q/K/V biases and rotates
pairs half a head apart (NeoX) where llama's converted weights pair adjacent elements. gemma3
(as Google's gemma_pytorch and the GGUF describe it): embeddings times sqrt(dim), per-head RMS
norms of Q and K, norms after attention and after the MLP, GELU-tanh, head width from
attention.key_length, and five layers in six attending through a sliding window of
attention.sliding_window tokens on RoPE base 10,000 (the sixth global, on rope.freq_base).

    python3 tests/reference/llama_ref.py MODEL.gguf 1 2 3 ...
"""
import struct
import sys

import numpy as np


def read_gguf(path):
    with open(path, "rb") as f:
        raw = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, raw, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = raw[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
              10: "<Q", 11: "<q", 12: "<d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = take("<I")
            n = take("<Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert raw[:4] == b"GGUF"
    pos = 4
    take("<I")
    n_tensors = take("<Q")
    n_kv = take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        dims = [take("<Q") for _ in range(nd)]
        infos.append((name, dims, take("<I"), take("<Q")))
    align = meta.get("general.alignment", 32)
    start = (pos + align - 1) // align * align
    return raw, meta, infos, start


def dequant(raw, start, dims, ttype, off):
    n = int(np.prod(dims))
    base = start + off
    if ttype == 0:
        out = np.frombuffer(raw, np.float32, n, base)
    elif ttype == 1:
        out = np.frombuffer(raw, np.float16, n, base).astype(np.float32)
    elif ttype in (2, 3, 8):
        bs = {2: 18, 3: 20, 8: 34}[ttype]
        nb = n // 32
        blk = np.frombuffer(raw, np.uint8, nb * bs, base).reshape(nb, bs)
        d = blk[:, 0:2].copy().view(np.float16).astype(np.float32)
        if ttype == 8:
            q = blk[:, 2:].copy().view(np.int8).astype(np.float32)
            out = d * q
        else:
            qs = blk[:, 4:] if ttype == 3 else blk[:, 2:]
            q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32)
            if ttype == 3:
                m = blk[:, 2:4].copy().view(np.float16).astype(np.float32)
                out = d * q + m
            else:
                out = d * (q - 8)
        out = out.reshape(-1)
    elif ttype == 6:  # Q5_0: d, 32 high bits, 16 bytes of low nibbles
        nb = n // 32
        blk = np.frombuffer(raw, np.uint8, nb * 22, base).reshape(nb, 22)
        d = blk[:, 0:2].copy().view(np.float16).astype(np.float32)
        qh = blk[:, 2:6].copy().view(np.uint32)
        bits = (qh >> np.arange(32, dtype=np.uint32)[None, :]) & 1
        qs = blk[:, 6:]
        lo = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int32)
        out = (d * ((lo | (bits.astype(np.int32) << 4)) - 16)).reshape(-1)
    elif ttype == 12:  # Q4_K: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        nb = n // 256
        blk = np.frombuffer(raw, np.uint8, nb * 144, base).reshape(nb, 144)
        d = blk[:, 0:2].copy().view(np.float16).astype(np.float32)
        dmin = blk[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc = blk[:, 4:16].astype(np.int32)
        scale = np.zeros((nb, 8), np.int32)
        mins = np.zeros((nb, 8), np.int32)
        scale[:, :4] = sc[:, 0:4] & 63
        mins[:, :4] = sc[:, 4:8] & 63
        scale[:, 4:] = (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)
        mins[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
        qs = blk[:, 16:].reshape(nb, 4, 32)
        q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float32)
        out = (d[:, :, None] * scale[:, :, None] * q - dmin[:, :, None] * mins[:, :, None])
        out = out.reshape(-1)
    elif ttype == 14:  # Q6_K: 128 low-nibble bytes, 64 high-2-bit bytes, 16 int8 scales, d
        nb = n // 256
        blk = np.frombuffer(raw, np.uint8, nb * 210, base).reshape(nb, 210)
        ql = blk[:, 0:128].reshape(nb, 2, 64).astype(np.int32)
        qh = blk[:, 128:192].reshape(nb, 2, 32).astype(np.int32)
        sc = blk[:, 192:208].copy().view(np.int8).astype(np.float32).reshape(nb, 2, 8)
        d = blk[:, 208:210].copy().view(np.float16).astype(np.float32).reshape(nb, 1, 1)
        q = np.empty((nb, 2, 128), np.int32)
        q[:, :, 0:32] = (ql[:, :, 0:32] & 0xF) | (((qh >> 0) & 3) << 4)
        q[:, :, 32:64] = (ql[:, :, 32:64] & 0xF) | (((qh >> 2) & 3) << 4)
        q[:, :, 64:96] = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
        q[:, :, 96:128] = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
        scale = np.repeat(sc, 16, axis=2)  # one scale per 16 elements
        out = (d * scale * (q - 32)).reshape(-1)
    else:
        raise SystemExit(f"reference: tensor type {ttype} not handled")
    return out.reshape(list(reversed(dims))).astype(np.float32)


def main():
    path = sys.argv[1]
    tokens = [int(t) for t in sys.argv[2:]]
    raw, meta, infos, start = read_gguf(path)
    w = {name: dequant(raw, start, dims, t, off) for name, dims, t, off in infos}
    arch = meta["general.architecture"]
    a = arch + "."
    L = meta[a + "block_count"]
    D = meta[a + "embedding_length"]
    H = meta[a + "attention.head_count"]
    Hk = meta.get(a + "attention.head_count_kv", H)
    gemma = arch == "gemma3"
    hd = meta.get(a + "attention.key_length", D // H)
    rot = meta.get(a + "rope.dimension_count", hd)
    theta = meta.get(a + "rope.freq_base", 10000.0)
    eps = meta.get(a + "attention.layer_norm_rms_epsilon", 1e-5)
    neox = arch in ("qwen2", "gemma3")
    window = meta.get(a + "attention.sliding_window", 0) if gemma else 0
    pattern = meta.get(a + "attention.sliding_window_pattern", 6)
    theta_local = meta.get(a + "rope.freq_base_swa", 10000.0)
    n = len(tokens)

    def rms(x, g):
        return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps).astype(np.float32) * g

    def table(base):
        inv = base ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    tables = {theta: table(theta), theta_local: table(theta_local)}

    def rope(x, base):  # x: [n, heads, hd]
        cos, sin = tables[base]
        y = x.copy()
        if neox:  # pair (i, i + rot/2)
            ia, ib = slice(0, rot // 2), slice(rot // 2, rot)
        else:  # GGUF llama pairs adjacent elements
            ia, ib = slice(0, rot, 2), slice(1, rot, 2)
        a, b = x[..., ia], x[..., ib]
        y[..., ia] = a * cos[:, None, :] - b * sin[:, None, :]
        y[..., ib] = a * sin[:, None, :] + b * cos[:, None, :]
        return y

    def lin(h, name):
        y = h @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    x = w["token_embd.weight"][tokens]
    if gemma:
        x = x * np.float32(np.sqrt(D))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    causal = np.where(j <= i, 0.0, -np.inf).astype(np.float32)
    # a windowed layer's query at i sees keys j with i - window < j <= i
    windowed = np.where((j <= i) & (j > i - window), 0.0, -np.inf).astype(np.float32)
    for l in range(L):
        p = f"blk.{l}."
        local = gemma and window > 0 and l % pattern < pattern - 1
        base = theta_local if local else theta
        mask = windowed if local else causal
        h = rms(x, w[p + "attn_norm.weight"])
        q = lin(h, p + "attn_q").reshape(n, H, hd)
        k = lin(h, p + "attn_k").reshape(n, Hk, hd)
        if gemma:
            q = rms(q, w[p + "attn_q_norm.weight"])
            k = rms(k, w[p + "attn_k_norm.weight"])
        q, k = rope(q, base), rope(k, base)
        v = lin(h, p + "attn_v").reshape(n, Hk, hd)
        k = np.repeat(k, H // Hk, axis=1)
        v = np.repeat(v, H // Hk, axis=1)
        s = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", s, v).reshape(n, H * hd) @ w[p + "attn_output.weight"].T
        if gemma:
            o = rms(o, w[p + "post_attention_norm.weight"])
        x = x + o
        h = rms(x, w[p + "ffn_norm.weight"])
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        if gemma:  # GELU, tanh form
            act = 0.5 * g * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (g + 0.044715 * g ** 3)))
        else:  # SiLU
            act = g / (1 + np.exp(-g))
        o = (act * u) @ w[p + "ffn_down.weight"].T
        if gemma:
            o = rms(o, w[p + "post_ffw_norm.weight"])
        x = x + o
    out = w.get("output.weight", w["token_embd.weight"])
    logits = rms(x[-1], w["output_norm.weight"]) @ out.T
    cap = meta.get(a + "final_logit_softcapping", 0.0)
    if cap:
        logits = cap * np.tanh(logits / cap)
    sys.stdout.write("\n".join(f"{v:.6g}" for v in logits))


if __name__ == "__main__":
    main()
