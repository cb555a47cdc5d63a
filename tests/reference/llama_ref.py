#!/usr/bin/env python3
"""Independent reference forward pass for GGUF Llama models, in numpy.

Reads the GGUF itself (no code shared with the C++ engine), dequantizes F32/F16/Q4_0/Q4_1/Q8_0,
and runs a plain causal forward pass over the given token ids, printing the last token's
logits, one per line.

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
    else:
        raise SystemExit(f"reference: tensor type {ttype} not handled")
    return out.reshape(list(reversed(dims))).astype(np.float32)


def main():
    path = sys.argv[1]
    tokens = [int(t) for t in sys.argv[2:]]
    raw, meta, infos, start = read_gguf(path)
    w = {name: dequant(raw, start, dims, t, off) for name, dims, t, off in infos}
    L = meta["llama.block_count"]
    D = meta["llama.embedding_length"]
    H = meta["llama.attention.head_count"]
    Hk = meta.get("llama.attention.head_count_kv", H)
    hd = D // H
    rot = meta.get("llama.rope.dimension_count", hd)
    theta = meta.get("llama.rope.freq_base", 10000.0)
    eps = meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)
    n = len(tokens)

    def rms(x, g):
        return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps).astype(np.float32) * g

    inv = theta ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def rope(x):  # x: [n, heads, hd]; GGUF llama pairs adjacent elements
        y = x.copy()
        a, b = x[..., 0:rot:2], x[..., 1:rot:2]
        y[..., 0:rot:2] = a * cos[:, None, :] - b * sin[:, None, :]
        y[..., 1:rot:2] = a * sin[:, None, :] + b * cos[:, None, :]
        return y

    x = w["token_embd.weight"][tokens]
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    for l in range(L):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(n, H, hd))
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(n, Hk, hd))
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, Hk, hd)
        k = np.repeat(k, H // Hk, axis=1)
        v = np.repeat(v, H // Hk, axis=1)
        s = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", s, v).reshape(n, H * hd)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
    out = w.get("output.weight", w["token_embd.weight"])
    logits = rms(x[-1], w["output_norm.weight"]) @ out.T
    sys.stdout.write("\n".join(f"{v:.6g}" for v in logits))


if __name__ == "__main__":
    main()
