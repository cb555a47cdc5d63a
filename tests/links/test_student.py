"""The student of every adapter kind (tools/links/links/student.py) on a tiny random model in
float64: gradients of each new parameter kind (deep rows before the question, deep and shallow
header and trailer rows compiled with every span, the deep low-rank correction of each span's
K/V) against central finite differences; padding changes nothing; a deep row holding the K/V a
shallow row computed gives the same output; a span compiled in two parts (the layers below the
correction as cached, the corrected ones) is the span compiled whole, and a zero correction
changes nothing."""
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
          student.Shape("embedding", 2, 0, 0),
          # the low-rank correction of the last layer: with rows before the question, with a
          # deep trailer too, and alone
          student.Shape("kv", 0, 0, 2, 2, 1), student.Shape("kv", 0, 1, 1, 3, 1),
          student.Shape("kv", 0, 0, 0, 2, 1)]


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
    if shape.lowrank:
        # emb: each span's hidden state entering the corrected layers; flat: the layers below
        # them, span after span, each padded to Tb.
        lo = shape.first_corrected(c.n_layers)
        fk = jnp.asarray(rng.normal(0, 1, (lo, 3 * Tb, c.n_kv_heads, c.head_dim)))
        fv = jnp.asarray(rng.normal(0, 1, (lo, 3 * Tb, c.n_kv_heads, c.head_dim)))
        fpos = (start[:, None] + h + np.arange(Tb)[None, :]).reshape(-1)
        fvalid = (np.arange(Tb)[None, :] < lens[:, None]).reshape(-1)
        flat = (fk, fv, jnp.asarray(fpos, jnp.int32), jnp.asarray(fvalid))
    elif precompiled:  # random span K/V already at their positions (no wrappers in the path)
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
    if shape.lowrank:
        n, r = shape.lowrank_layers, shape.lowrank
        theta["lowrank_a"] = jnp.asarray(rng.normal(0, 0.5, (n, c.dim, r)))
        theta["lowrank_b"] = jnp.asarray(rng.normal(0, 0.5, (n, r, 2, c.n_kv_heads, c.head_dim)))
    K = 5
    t_ids = jnp.asarray(np.stack([rng.permutation(c.vocab)[:K] for _ in range(3)]))
    t_lp = jnp.asarray(np.log(np.array([[0.5, 0.2, 0.1, 0.05, 0.05]] * 3)))
    args = (pre, flat, (emb, jnp.asarray(lens), jnp.asarray(start), used), at, x, jnp.int32(5),
            jnp.int32(3), t_ids, t_lp, jnp.asarray([2.0, 1.0, 1.0]))
    return theta, args


CASES = [("llama", s) for s in SHAPES] + [("gemma3", SHAPES[1]), ("gemma3", SHAPES[3]),
                                          ("gemma3", SHAPES[5])]


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


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_span_compiled_in_two_parts_is_the_span_compiled_whole(arch):
    """The student of a correction compiles each span's corrected layers from the hidden state
    entering them over the cached lower layers: with the correction at zero that is the span
    compiled whole (what naive reuse serves), and a correction that is not zero moves it."""
    m = tiny(arch)
    c = m.cfg
    rng = np.random.default_rng(4)
    plain, corrected = student.Shape("kv", 0, 0, 2), student.Shape("kv", 0, 0, 2, 2, 1)
    theta, args = setup(m, plain, precompiled=True)
    pre, _, (_, lens, start, used), at, x, n_new = args[:6]
    lo, Tb, npre = corrected.first_corrected(c.n_layers), 4, 3
    toks = [rng.integers(0, c.vocab, int(n)) for n in lens[:2]]
    whole, lower, hidden = [], [], []
    for t in toks:
        e = jnp.asarray(m.emb[t], jnp.float64)
        pos = npre + jnp.arange(len(t))
        k, v, _ = M.run_rows(c, m.params, e, pos, jnp.ones(len(t), bool), pre[0], pre[1], pre[2],
                             jnp.ones(npre, bool))
        whole.append((k, v))
        k, v, xm = M.run_rows(c, M.layers(m.params, 0, lo), e, pos, jnp.ones(len(t), bool),
                              pre[0][:lo], pre[1][:lo], pre[2], jnp.ones(npre, bool))
        lower.append((k, v))
        hidden.append(xm)
    fk = jnp.concatenate([k for k, _ in whole], 1)
    fv = jnp.concatenate([v for _, v in whole], 1)
    fpos = jnp.concatenate([start[i] + jnp.arange(len(t)) for i, t in enumerate(toks)])
    a = student.student_logp(c, plain, m.params, theta, pre,
                             (fk, fv, fpos.astype(jnp.int32), jnp.ones(fpos.shape[0], bool)),
                             args[2], at, x, n_new)
    emb = np.zeros((3, Tb, c.dim))
    lk = np.zeros((lo, 3 * Tb, c.n_kv_heads, c.head_dim))
    lv = np.zeros_like(lk)
    for i, t in enumerate(toks):
        emb[i, : len(t)] = hidden[i]
        lk[:, i * Tb: i * Tb + len(t)] = lower[i][0]
        lv[:, i * Tb: i * Tb + len(t)] = lower[i][1]
    lpos = (np.asarray(start)[:, None] + np.arange(Tb)[None, :]).reshape(-1)
    lvalid = (np.arange(Tb)[None, :] < np.asarray(lens)[:, None]).reshape(-1)
    flat = (jnp.asarray(lk), jnp.asarray(lv), jnp.asarray(lpos, jnp.int32), jnp.asarray(lvalid))
    spans = (jnp.asarray(emb), lens, start, used)
    th = dict(theta, lowrank_a=jnp.asarray(rng.normal(0, 0.5, (1, c.dim, 2))),
              lowrank_b=jnp.zeros((1, 2, 2, c.n_kv_heads, c.head_dim)))
    b = student.student_logp(c, corrected, m.params, th, pre, flat, spans, at, x, n_new)
    assert float(jnp.abs(a - b)[:5].max()) < 1e-9
    th["lowrank_b"] = jnp.asarray(rng.normal(0, 0.5, th["lowrank_b"].shape))
    moved = student.student_logp(c, corrected, m.params, th, pre, flat, spans, at, x, n_new)
    assert float(jnp.abs(a - moved)[:5].max()) > 1e-3


def test_a_correction_is_refused_where_it_would_change_a_spans_compile():
    with pytest.raises(ValueError):
        student.Shape("kv", 2, 0, 2, 2, 1)  # a header: the span's compile is in the path
    with pytest.raises(ValueError):
        student.Shape("embedding", 0, 2, 2, 2, 1)  # a shallow trailer: the same
    with pytest.raises(ValueError):
        student.Shape("kv", 0, 0, 2, 2, 0)  # a rank without layers
