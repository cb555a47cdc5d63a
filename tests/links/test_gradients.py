"""The trainer's gradients against central finite differences, on a tiny random model in float64
(the link rows are the only parameters; the model is frozen). A wrong mask, a dropped context row
or a stop-gradient in the wrong place changes the loss's slope and fails here."""
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "links"))
from links import model as M  # noqa: E402
from links import pic  # noqa: E402


def tiny(arch="llama", seed=0):
    rng = np.random.default_rng(seed)
    L, D, H, Hk, hd, F, V = 2, 16, 2, 1, 8, 24, 40
    gemma = arch == "gemma3"
    cfg = M.Config(arch=arch, n_layers=L, dim=D, n_heads=H, n_kv_heads=Hk, head_dim=hd, ffn=F,
                   vocab=V, eps=1e-6, neox=arch != "llama", gemma=gemma, rot=hd)

    def r(*s, scale=0.3):
        return rng.normal(0, scale, s)

    layers = {"wq": r(L, H * hd, D), "wk": r(L, Hk * hd, D), "wv": r(L, Hk * hd, D),
              "wo": r(L, D, H * hd), "wg": r(L, F, D), "wu": r(L, F, D), "wd": r(L, D, F),
              "attn_norm": 1 + r(L, D, scale=0.1), "ffn_norm": 1 + r(L, D, scale=0.1),
              "bq": r(L, H * hd, scale=0.1), "bk": r(L, Hk * hd, scale=0.1),
              "bv": r(L, Hk * hd, scale=0.1)}
    if gemma:
        layers.update(q_norm=1 + r(L, hd, scale=0.1), k_norm=1 + r(L, hd, scale=0.1),
                      post_attn=1 + r(L, D, scale=0.1), post_ffn=1 + r(L, D, scale=0.1))
    w = {"emb": r(V, D, scale=1.0), "out": r(V, D, scale=1.0), "out_norm": 1 + r(D, scale=0.1),
         "layers": layers}
    windows = np.array([3, M.NO_WINDOW]) if gemma else np.array([M.NO_WINDOW] * L)
    m = M.Model(cfg, w, windows, np.array([10000.0, 1e6]) if gemma else np.full(L, 10000.0))
    m.params["layers"] = {k: jnp.asarray(v, jnp.float64) for k, v in layers.items()}
    m.params["out"] = jnp.asarray(w["out"], jnp.float64)
    m.params["out_norm"] = jnp.asarray(w["out_norm"], jnp.float64)
    return m


def problem(m, k=2, seed=1):
    """A relocated context (two spans at new positions), k link rows, a question and an answer,
    and a teacher distribution over the rows."""
    rng = np.random.default_rng(seed)
    c = m.cfg
    ctx_len = 9
    ck = jnp.asarray(rng.normal(0, 1, (c.n_layers, ctx_len, c.n_kv_heads, c.head_dim)))
    cv = jnp.asarray(rng.normal(0, 1, (c.n_layers, ctx_len, c.n_kv_heads, c.head_dim)))
    cpos = jnp.asarray(np.concatenate([np.arange(4), 10 + np.arange(5)]), jnp.int32)
    cvalid = jnp.asarray(np.arange(ctx_len) < 8)  # one padding row
    toks = rng.integers(0, c.vocab, 5)
    x = jnp.asarray(m.emb[toks], jnp.float64)
    pos = jnp.asarray(15 + np.arange(k + 5), jnp.int32)
    valid = jnp.asarray(np.arange(k + 5) < k + 4)  # the last row padding
    t = rng.normal(0, 2, (4, c.vocab))
    tlp = jnp.asarray(t - np.log(np.exp(t).sum(-1, keepdims=True)))
    w = jnp.asarray([0.2, 0.2, 1.0, 1.0])
    links = jnp.asarray(rng.normal(0, 1, (k, c.dim)))
    return links, (x, pos, valid, ck, cv, cpos, cvalid, tlp, w)


def check(arch):
    m = tiny(arch)
    k = 2
    links, args = problem(m, k)
    loss, grad = pic.loss_and_grad(m.cfg, k, m.params, links, *args)
    assert float(loss) > 0
    f = jax.jit(lambda l: pic.loss_and_grad(m.cfg, k, m.params, l, *args)[0])
    rng = np.random.default_rng(3)
    for _ in range(6):
        d = jnp.asarray(rng.normal(0, 1, links.shape))
        h = 1e-5
        fd = (float(f(links + h * d)) - float(f(links - h * d))) / (2 * h)
        an = float(jnp.sum(grad * d))
        assert abs(fd - an) <= 1e-6 + 1e-5 * abs(fd), (fd, an)


def test_gradients_llama():
    check("llama")


def test_gradients_qwen2():
    check("qwen2")


def test_gradients_gemma3_windows():
    check("gemma3")


def test_padding_rows_change_nothing():
    """Padding rows of the context and of the new rows are masked: the loss does not move when
    their contents do."""
    m = tiny("llama")
    links, (x, pos, valid, ck, cv, cpos, cvalid, tlp, w) = problem(m)
    base = float(pic.loss_and_grad(m.cfg, 2, m.params, links, x, pos, valid, ck, cv, cpos,
                                   cvalid, tlp, w)[0])
    ck2 = ck.at[:, 8].set(100.0)
    x2 = x.at[4].set(50.0)
    moved = float(pic.loss_and_grad(m.cfg, 2, m.params, links, x2, pos, valid, ck2, cv, cpos,
                                    cvalid, tlp, w)[0])
    assert abs(moved - base) < 1e-12
