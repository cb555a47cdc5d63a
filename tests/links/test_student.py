"""The student of every adapter kind (tools/links/links/student.py) on a tiny random model in
float64: gradients of each new parameter kind (deep rows before the question, deep and shallow
header and trailer rows compiled with every span) against central finite differences; padding
changes nothing; a deep row holding the K/V a shallow row computed gives the same output."""
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "links"))
from links import model as M  # noqa: E402
from links import student  # noqa: E402
from test_gradients import tiny  # noqa: E402

SHAPES = [student.Shape("kv", 0, 0, 2), student.Shape("kv", 2, 1, 0),
          student.Shape("kv", 0, 2, 1), student.Shape("embedding", 1, 2, 2),
          student.Shape("embedding", 2, 0, 0)]


def setup(m, shape, seed=1, precompiled=False):
    rng = np.random.default_rng(seed)
    c = m.cfg
    f64 = jnp.float64
    pre_t = rng.integers(0, c.vocab, 3)
    pk, pv, _ = M.run_rows(c, m.params, jnp.asarray(m.emb[pre_t], f64), jnp.arange(3),
                           jnp.ones(3, bool), *M.empty_ctx(m))
    pre = (pk.astype(f64), pv.astype(f64), jnp.arange(3, dtype=jnp.int32))
    lens = np.array([3, 4, 0], np.int32)  # the third span is padding
    Tb = 4
    emb = jnp.asarray(rng.normal(0, 1, (3, Tb, c.dim)))
    h, t = shape.header, shape.trailer
    start = 3 + np.array([0, h + 3 + t, 2 * (h + t) + 7], np.int32)
    used = jnp.asarray([True, True, False])
    at = jnp.int32(3 + 2 * (h + t) + 7)
    zero = jnp.zeros((c.n_layers, 0, c.n_kv_heads, c.head_dim), f64)
    flat = (zero, zero, jnp.zeros(0, jnp.int32), jnp.zeros(0, bool))
    if precompiled:  # random span K/V already at their positions (no wrappers in the path)
        fk = jnp.asarray(rng.normal(0, 1, (c.n_layers, 7, c.n_kv_heads, c.head_dim)))
        fv = jnp.asarray(rng.normal(0, 1, (c.n_layers, 7, c.n_kv_heads, c.head_dim)))
        fpos = jnp.asarray(np.concatenate([start[0] + h + np.arange(3),
                                           start[1] + h + np.arange(4)]), jnp.int32)
        flat = (fk, fv, fpos, jnp.ones(7, bool))
    x = jnp.asarray(rng.normal(0, 1, (6, c.dim)))
    theta = {}
    for name, k in (("header", h), ("trailer", t), ("question", shape.before_question)):
        if not k:
            continue
        if shape.depth == "kv":
            theta[name] = jnp.asarray(rng.normal(0, 1, (2, c.n_layers, k, c.n_kv_heads,
                                                        c.head_dim)))
        else:
            theta[name] = jnp.asarray(rng.normal(0, 1, (k, c.dim)))
    K = 5
    t_ids = jnp.asarray(np.stack([rng.permutation(c.vocab)[:K] for _ in range(3)]))
    t_lp = jnp.asarray(np.log(np.array([[0.5, 0.2, 0.1, 0.05, 0.05]] * 3)))
    args = (pre, flat, (emb, jnp.asarray(lens), jnp.asarray(start), used), at, x, jnp.int32(5),
            jnp.int32(3), t_ids, t_lp, jnp.asarray([2.0, 1.0, 1.0]))
    return theta, args


CASES = [("llama", s) for s in SHAPES] + [("gemma3", SHAPES[1]), ("gemma3", SHAPES[3])]


@pytest.mark.parametrize("arch,shape", CASES, ids=str)
def test_gradients_of_every_row_kind(arch, shape):
    m = tiny(arch)
    theta, args = setup(m, shape, precompiled=not shape.compiles_in_path)
    loss, grad = student.loss_and_grad(m.cfg, shape, m.params, theta, *args)
    assert float(loss) > 0
    f = jax.jit(lambda th: student.loss_and_grad(m.cfg, shape, m.params, th, *args)[0])
    rng = np.random.default_rng(3)
    for name in theta:
        assert float(jnp.abs(grad[name]).max()) > 0, name  # every group is read
        for _ in range(3):
            d = jnp.asarray(rng.normal(0, 1, theta[name].shape))
            hh = 1e-5
            up = dict(theta, **{name: theta[name] + hh * d})
            dn = dict(theta, **{name: theta[name] - hh * d})
            fd = (float(f(up)) - float(f(dn))) / (2 * hh)
            an = float(jnp.sum(grad[name] * d))
            assert abs(fd - an) <= 1e-6 + 1e-5 * abs(fd), (name, fd, an)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_padding_changes_nothing(shape):
    """The padded span, the tokens past each span's length and the rows past the new ones are
    masked: the loss does not move when their contents do."""
    m = tiny("llama")
    theta, args = setup(m, shape)
    base = float(student.loss_and_grad(m.cfg, shape, m.params, theta, *args)[0])
    pre, flat, (emb, lens, start, used), at, x, *rest = args
    emb2 = emb.at[2].set(40.0).at[0, 3].set(-30.0)  # padded span; span 0's fourth row
    x2 = x.at[5].set(50.0)  # the new rows' padding
    moved = float(student.loss_and_grad(m.cfg, shape, m.params, theta, pre, flat,
                                        (emb2, lens, start, used), at, x2, *rest)[0])
    assert abs(moved - base) < 1e-12


def test_a_deep_row_holding_a_shallow_rows_kv_gives_the_same_output():
    """Rows before the question: the K/V a shallow row computes over the relocated spans, held
    by a deep row at the same position, give the question the same log-probs (what relokv's
    engine writes for a deep row is what it would have computed)."""
    m = tiny("llama")
    sh = student.Shape("embedding", 0, 0, 2)
    theta, args = setup(m, sh, precompiled=True)
    pre, flat, spans, at, x, n_new = args[:6]
    c = m.cfg
    ck = jnp.concatenate([pre[0], flat[0]], 1)
    cv = jnp.concatenate([pre[1], flat[1]], 1)
    cpos = jnp.concatenate([pre[2], flat[2]])
    k, v, _ = M.run_rows(c, m.params, theta["question"], at + jnp.arange(2), jnp.ones(2, bool),
                         ck, cv, cpos, jnp.ones(cpos.shape[0], bool))
    dh = student.Shape("kv", 0, 0, 2)
    deep = {"question": jnp.stack([k, v], 0)}
    a = student.student_logp(c, sh, m.params, theta, pre, flat, spans, at, x, n_new)
    b = student.student_logp(c, dh, m.params, deep, pre, flat, spans, at, x, n_new)
    assert float(jnp.abs(a - b)[:5].max()) < 1e-9
