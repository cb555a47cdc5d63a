"""The frozen model in JAX, from the same GGUF the engine reads (dequantized to fp32).

One function runs any rows: `run_rows` takes the rows' input vectors (token embeddings or learned
link rows), their logical positions, and a context of earlier rows' keys (unrotated) and values
with their positions; it returns every layer's keys and values of the new rows and their final
hidden states. The teacher (the whole prompt), a span compiled behind the system prompt, and the
student (relocated spans, then links, question and answer) are all calls of it: relocation is
RoPE at the reading request's positions, as relokv's kernels do.

Architectures: llama (GPT-J pairs: the converter permutes Q and K), qwen2 (Q/K/V biases, NeoX
pairs) and gemma3 (scaled embeddings, per-head Q/K norms, norms after attention and MLP, GELU,
sliding windows on five layers in six with their own RoPE base), as the engine and
tests/reference/llama_ref.py read them.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

_REF = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "reference")
sys.path.insert(0, os.path.abspath(_REF))
import llama_ref  # noqa: E402  (the project's independent GGUF reader and dequantizer)

NO_WINDOW = 1 << 30


@dataclasses.dataclass(frozen=True)
class Config:
    arch: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    eps: float
    neox: bool
    gemma: bool
    rot: int


class Model:
    """Weights stacked per layer (for lax.scan) plus the embedding and output matrices."""

    def __init__(self, cfg: Config, w: dict, windows: np.ndarray, bases: np.ndarray,
                 path: str = ""):
        self.cfg = cfg
        self.path = path
        self.windows = jnp.asarray(windows, jnp.int32)  # per layer, NO_WINDOW for global
        self.bases = jnp.asarray(bases, jnp.float32)  # per layer RoPE base
        self.emb = w["emb"]  # numpy [vocab, dim], unscaled
        self.out = w["out"]  # numpy [vocab, dim]
        # What the jitted functions take as an argument (never closed over: constants that big
        # would be folded into every compiled program).
        self.params = {"layers": {k: jnp.asarray(v) for k, v in w["layers"].items()},
                       "out_norm": jnp.asarray(w["out_norm"]), "out": jnp.asarray(self.out),
                       "windows": self.windows, "bases": self.bases}
        self.embed_scale = float(np.sqrt(cfg.dim)) if cfg.gemma else 1.0

    def embed(self, tokens) -> np.ndarray:
        """Input rows of token ids (numpy, fp32), scaled as the engine scales them."""
        return (self.emb[np.asarray(tokens, np.int64)] * np.float32(self.embed_scale)).astype(
            np.float32)


def load(path: str) -> Model:
    raw, meta, infos, start = llama_ref.read_gguf(path)
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2", "gemma3"):
        raise SystemExit(f"{path}: architecture {arch} not handled (llama, qwen2, gemma3)")
    a = arch + "."
    L = meta[a + "block_count"]
    D = meta[a + "embedding_length"]
    H = meta[a + "attention.head_count"]
    Hk = meta.get(a + "attention.head_count_kv", H)
    hd = meta.get(a + "attention.key_length", D // H)
    gemma = arch == "gemma3"
    tensors = {name: (dims, t, off) for name, dims, t, off in infos}

    def get(name):
        dims, t, off = tensors[name]
        return llama_ref.dequant(raw, start, dims, t, off)

    emb = get("token_embd.weight")
    out = get("output.weight") if "output.weight" in tensors else emb
    F = meta[a + "feed_forward_length"]
    cfg = Config(arch=arch, n_layers=L, dim=D, n_heads=H, n_kv_heads=Hk, head_dim=hd, ffn=F,
                 vocab=emb.shape[0], eps=float(meta.get(a + "attention.layer_norm_rms_epsilon",
                                                        1e-5)),
                 neox=arch in ("qwen2", "gemma3"), gemma=gemma,
                 rot=meta.get(a + "rope.dimension_count", hd))
    names = {"wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight",
             "wo": "attn_output.weight", "wg": "ffn_gate.weight", "wu": "ffn_up.weight",
             "wd": "ffn_down.weight", "attn_norm": "attn_norm.weight",
             "ffn_norm": "ffn_norm.weight"}
    if gemma:
        names.update(q_norm="attn_q_norm.weight", k_norm="attn_k_norm.weight",
                     post_attn="post_attention_norm.weight", post_ffn="post_ffw_norm.weight")
    layers = {k: [] for k in names}
    for k in ("bq", "bk", "bv"):
        layers[k] = []
    for l in range(L):
        p = f"blk.{l}."
        for k, n in names.items():
            layers[k].append(get(p + n))
        for k, n, size in (("bq", "attn_q.bias", H * hd), ("bk", "attn_k.bias", Hk * hd),
                           ("bv", "attn_v.bias", Hk * hd)):
            layers[k].append(get(p + n) if p + n in tensors else np.zeros(size, np.float32))
    stacked = {k: np.stack(v).astype(np.float32) for k, v in layers.items()}
    theta = float(meta.get(a + "rope.freq_base", 10000.0))
    window = int(meta.get(a + "attention.sliding_window", 0)) if gemma else 0
    pattern = int(meta.get(a + "attention.sliding_window_pattern", 6))
    theta_local = float(meta.get(a + "rope.freq_base_swa", 10000.0))
    local = np.array([gemma and window > 0 and l % pattern < pattern - 1 for l in range(L)])
    windows = np.where(local, window, NO_WINDOW)
    bases = np.where(local, theta_local, theta)
    w = {"emb": emb, "out": out, "out_norm": get("output_norm.weight"), "layers": stacked}
    return Model(cfg, w, windows, bases, path)


def _rms(x, g, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _rope(cfg: Config, x, pos, base):
    """x [n, heads, hd] rotated to positions pos [n] with RoPE base `base`."""
    rot = cfg.rot
    inv = base ** (-jnp.arange(0, rot, 2, dtype=jnp.float32) / rot)
    ang = pos.astype(jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    if cfg.neox:
        a, b = x[..., : rot // 2], x[..., rot // 2: rot]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        return jnp.concatenate([ra, rb, x[..., rot:]], axis=-1)
    a, b = x[..., 0:rot:2], x[..., 1:rot:2]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    inter = jnp.stack([ra, rb], axis=-1).reshape(x.shape[:-1] + (rot,))
    return jnp.concatenate([inter, x[..., rot:]], axis=-1)


def run_rows(cfg: Config, P, x, pos, valid, ctx_k, ctx_v, ctx_pos, ctx_valid, corr=None):
    """Runs rows x [n, dim] at positions pos [n] (valid [n]: padding rows are False) over a
    context of earlier rows: ctx_k, ctx_v [L, m, Hk, hd] (keys unrotated), ctx_pos [m],
    ctx_valid [m]. Row i attends to every valid context row and to valid new rows j <= i, within
    its layer's window by logical position. Returns (k [L, n, Hk, hd] unrotated, v, hidden
    [n, dim] before the final norm). L is however many layers P holds (layers(P, lo, hi) runs
    a range of them, from the hidden state entering layer lo).

    corr, when given, is a low-rank correction of the rows' keys and values (a span link's
    deep correction, links/student.py): (a [L, dim, r], b [L, r, 2, Hk, hd], rows [n] bool);
    at each layer the rows marked get (h a) b[:, 0] added to their key and (h a) b[:, 1] to
    their value, h their attention input (the normed hidden state), after the head norms,
    before anything reads them."""
    H, Hk, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    n = x.shape[0]
    rep = H // Hk
    scale = 1.0 / np.sqrt(hd)
    ii = jnp.arange(n)
    causal = (ii[None, :] <= ii[:, None]) & valid[None, :]

    def layer(x, inputs):
        lw, ck, cv, window, base = inputs[:5]
        h = _rms(x, lw["attn_norm"], cfg.eps)
        q = (h @ lw["wq"].T + lw["bq"]).reshape(n, H, hd)
        k = (h @ lw["wk"].T + lw["bk"]).reshape(n, Hk, hd)
        v = (h @ lw["wv"].T + lw["bv"]).reshape(n, Hk, hd)
        if cfg.gemma:
            q = _rms(q, lw["q_norm"], cfg.eps)
            k = _rms(k, lw["k_norm"], cfg.eps)
        if corr is not None:
            ca, cb = inputs[5:]
            d = jnp.einsum("nr,rchd->cnhd", h @ ca, cb) * corr[2][None, :, None, None]
            k, v = k + d[0], v + d[1]
        qr = _rope(cfg, q, pos, base)
        keys = jnp.concatenate([ck, k], axis=0)
        vals = jnp.concatenate([cv, v], axis=0)
        kpos = jnp.concatenate([ctx_pos, pos])
        kr = _rope(cfg, keys, kpos, base)
        in_window = kpos[None, :] > pos[:, None] - window
        allowed = jnp.concatenate(
            [jnp.broadcast_to(ctx_valid[None, :], (n, ctx_pos.shape[0])), causal], axis=1)
        allowed = allowed & in_window
        kr = jnp.repeat(kr, rep, axis=1)
        vv = jnp.repeat(vals, rep, axis=1)
        s = jnp.einsum("ihd,jhd->hij", qr, kr) * scale
        s = jnp.where(allowed[None], s, -1e30)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("hij,jhd->ihd", p, vv).reshape(n, H * hd) @ lw["wo"].T
        if cfg.gemma:
            o = _rms(o, lw["post_attn"], cfg.eps)
        x = x + o
        h = _rms(x, lw["ffn_norm"], cfg.eps)
        g = h @ lw["wg"].T
        u = h @ lw["wu"].T
        act = jax.nn.gelu(g, approximate=True) if cfg.gemma else jax.nn.silu(g)
        o = (act * u) @ lw["wd"].T
        if cfg.gemma:
            o = _rms(o, lw["post_ffn"], cfg.eps)
        return x + o, (k, v)

    xs = (P["layers"], ctx_k, ctx_v, P["windows"], P["bases"])
    if corr is not None:
        xs = xs + (corr[0], corr[1])
    x, (ks, vs) = jax.lax.scan(layer, x, xs)
    return ks, vs, x


def layers(P, lo, hi):
    """P restricted to layers lo .. hi - 1 (what run_rows runs from the hidden state entering
    layer lo; the output matrix and final norm are kept)."""
    out = dict(P)
    out["layers"] = {k: v[lo:hi] for k, v in P["layers"].items()}
    out["windows"] = P["windows"][lo:hi]
    out["bases"] = P["bases"][lo:hi]
    return out


def logits_of(cfg: Config, P, hidden):
    """Logits [n, vocab] of final hidden states [n, dim]."""
    return _rms(hidden, P["out_norm"], cfg.eps) @ P["out"].T


def empty_ctx(model: Model, m: int = 0):
    c = model.cfg
    z = jnp.zeros((c.n_layers, m, c.n_kv_heads, c.head_dim), jnp.float32)
    return z, z, jnp.zeros((m,), jnp.int32), jnp.zeros((m,), bool)
