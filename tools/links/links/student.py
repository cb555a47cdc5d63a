"""The student of the distillation with every kind of learned row relokv serves.

An adapter has one depth for all its rows:
- "embedding" (shallow): each row is an input vector the first layer reads; every layer computes
  its keys and values from it;
- "kv" (deep): each row is every layer's key (before RoPE, as relokv's pool stores it) and value;
  nothing computes it, the attention reads it (prefix tuning / P-Tuning v2 / Cartridges).

and up to three groups of rows, as layout_builder::links places them:
- header rows before each span's tokens, compiled with the span (the span's tokens attend to
  them) and cached and relocated with it;
- trailer rows after each span's tokens, the same (a shallow trailer attends to the span; a deep
  one is the same K/V after every span, relocated with it);
- rows before the question, computed in every request over all spans.

and optionally a deep low-rank correction of each span's own keys and values in its last layers
(Kamera's finding: what a span computed alone lacks is a low-rank residue, mostly in the deep
layers): at each corrected layer a span token's key gets (h a) b_k and its value (h a) b_v added,
h its attention input, a [dim, r] and b [r, kv] learned per layer. It is computed with the span
when the span is compiled (cached and relocated with it, nothing at request time), from the
span's own hidden state, so it depends on the span's content but sees no other span.

The student is what relokv serves under naive reuse: the system prompt computed, each span
compiled alone behind it (with its wrappers), relocated by RoPE to the request's positions, then
the rows before the question, the question and the answer computed over all of it. Only the rows
are trained; the model is frozen. Spans without wrappers (or with a deep trailer only) do not
depend on the parameters and are computed once; a header or a shallow trailer puts each span's
compile in the gradient's path.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import model as M
from .pic import bucket


@dataclasses.dataclass(frozen=True)
class Shape:
    depth: str  # "embedding" or "kv"
    header: int = 0
    trailer: int = 0
    before_question: int = 0
    lowrank: int = 0  # the correction's rank (0: none)
    lowrank_layers: int = 0  # how many of the last layers it corrects

    def __post_init__(self):
        if self.lowrank < 0 or self.lowrank_layers < 0 or (self.lowrank > 0) != (
                self.lowrank_layers > 0):
            raise ValueError(f"{self}: a correction needs both a rank and a layer count")
        if self.lowrank and self.compiles_in_path:
            raise ValueError(f"{self}: a low-rank correction is trained with rows before the "
                             "question or a deep trailer, not with rows that change a span's "
                             "compile (a header, a shallow trailer)")

    @property
    def rows(self):
        return self.header + self.trailer + self.before_question

    @property
    def placement(self):
        wraps = self.header + self.trailer > 0
        if wraps and self.before_question:
            return "wrappers+before_question"
        if not wraps and not self.before_question:
            return "none"
        return "wrappers" if wraps else "before_question"

    def first_corrected(self, n_layers):
        """The first layer the correction changes (n_layers when there is none)."""
        return n_layers - self.lowrank_layers

    @property
    def compiles_in_path(self):
        """Whether a span's compile depends on the parameters (so runs in every step)."""
        return self.header > 0 or (self.trailer > 0 and self.depth == "embedding")


def init(model: M.Model, shape: Shape, passages, prefix_kv, seed: int):
    """Untrained rows. Shallow: embeddings of seeded random vocabulary tokens. Deep (Cartridges'
    initialization): the keys and values real tokens have, those of consecutive tokens of
    seeded training passages compiled behind the system prompt (prefix_kv: (k, v) of it)."""
    rng = np.random.default_rng(seed)
    c = model.cfg
    out = {}
    if shape.lowrank:  # LoRA's start: a random, b zero (the correction starts at nothing)
        n, r = shape.lowrank_layers, shape.lowrank
        out["lowrank_a"] = jnp.asarray(rng.normal(0, 1 / np.sqrt(c.dim), (n, c.dim, r)),
                                       jnp.float32)
        out["lowrank_b"] = jnp.zeros((n, r, 2, c.n_kv_heads, c.head_dim), jnp.float32)
    for name, n in (("header", shape.header), ("trailer", shape.trailer),
                    ("question", shape.before_question)):
        if n == 0:
            continue
        if shape.depth == "embedding":
            out[name] = jnp.asarray(model.embed(rng.integers(0, c.vocab, n)))
            continue
        ks, vs = [], []
        while sum(k.shape[1] for k in ks) < n:
            p = passages[int(rng.integers(len(passages)))]
            take = min(len(p), n - sum(k.shape[1] for k in ks))
            at = int(rng.integers(0, len(p) - take + 1))
            pk, pv = prefix_kv
            npre = pk.shape[1]
            x = jnp.asarray(model.embed(p[: at + take]))
            pos = jnp.arange(npre, npre + at + take, dtype=jnp.int32)
            k, v, _ = M.run_rows(c, model.params, x, pos, jnp.ones(at + take, bool), pk, pv,
                                 jnp.arange(npre, dtype=jnp.int32), jnp.ones(npre, bool))
            ks.append(np.asarray(k)[:, at:])
            vs.append(np.asarray(v)[:, at:])
        out[name] = jnp.stack([jnp.concatenate(ks, 1), jnp.concatenate(vs, 1)], 0)
        # [2, L, n, Hk, hd]
    return out


def _span_rows(cfg, shape: Shape, P, theta, emb, n_tok, pre_k, pre_v, pre_pos):
    """One span compiled behind the prefix with its wrappers: (k, v) [L, h + len + t, Hk, hd]
    (padded span rows included; their positions are masked later). emb [Tb, dim] holds the
    span's token embeddings, the first n_tok valid."""
    npre = pre_pos.shape[0]
    Tb = emb.shape[0]
    h, t = shape.header, shape.trailer
    ctx_k, ctx_v, ctx_pos = pre_k, pre_v, pre_pos
    ctx_valid = jnp.ones(npre, bool)
    tok_valid = jnp.arange(Tb) < n_tok
    if shape.depth == "embedding":
        parts = [theta["header"]] if h else []
        parts.append(emb)
        x = jnp.concatenate(parts, 0)
        valid = jnp.concatenate([jnp.ones(h, bool), tok_valid]) if h else tok_valid
        pos = npre + jnp.arange(h + Tb, dtype=jnp.int32)
        if t:  # trailer rows after the valid tokens: at positions npre + h + n_tok + i
            x = jnp.concatenate([x, theta["trailer"]], 0)
            pos = jnp.concatenate([pos, npre + h + n_tok + jnp.arange(t, dtype=jnp.int32)])
            valid = jnp.concatenate([valid, jnp.ones(t, bool)])
        k, v, _ = M.run_rows(cfg, P, x, pos, valid, ctx_k, ctx_v, ctx_pos, ctx_valid)
        return k, v
    # Deep: the header is context of the compile, the trailer is appended as it is.
    if h:
        ctx_k = jnp.concatenate([ctx_k, theta["header"][0]], 1)
        ctx_v = jnp.concatenate([ctx_v, theta["header"][1]], 1)
        ctx_pos = jnp.concatenate([ctx_pos, npre + jnp.arange(h, dtype=jnp.int32)])
        ctx_valid = jnp.ones(npre + h, bool)
    pos = npre + h + jnp.arange(Tb, dtype=jnp.int32)
    k, v, _ = M.run_rows(cfg, P, emb, pos, tok_valid, ctx_k, ctx_v, ctx_pos, ctx_valid)
    if h:
        k = jnp.concatenate([theta["header"][0], k], 1)
        v = jnp.concatenate([theta["header"][1], v], 1)
    if t:
        k = jnp.concatenate([k, theta["trailer"][0]], 1)
        v = jnp.concatenate([v, theta["trailer"][1]], 1)
    return k, v


def _span_corrected(cfg, shape: Shape, P, theta, x_mid, n_tok, pre_k, pre_v, pre_pos):
    """A span's corrected layers: the rows of its compile from the hidden state entering the
    first corrected layer (x_mid [Tb, dim], the first n_tok valid) through the last, with the
    correction on every token: (k, v) [lowrank_layers, Tb, Hk, hd]."""
    lo = shape.first_corrected(cfg.n_layers)
    Tb = x_mid.shape[0]
    npre = pre_pos.shape[0]
    valid = jnp.arange(Tb) < n_tok
    k, v, _ = M.run_rows(cfg, M.layers(P, lo, cfg.n_layers), x_mid,
                         npre + jnp.arange(Tb, dtype=jnp.int32), valid, pre_k[lo:], pre_v[lo:],
                         pre_pos, jnp.ones(npre, bool),
                         corr=(theta["lowrank_a"], theta["lowrank_b"], valid))
    return k, v


def _span_offsets(shape: Shape, Tb, lens):
    """Offsets of a wrapped span's rows [h, Tb tokens (first len valid), t] from its first row,
    and their validity: [S, h + Tb + t] each."""
    h, t = shape.header, shape.trailer
    i = jnp.arange(h + Tb + t)[None, :]
    off = jnp.where(i < h + Tb, i, h + lens[:, None] + (i - h - Tb))
    valid = (i < h) | (i < h + lens[:, None]) | (i >= h + Tb)
    return off, valid


@functools.partial(jax.jit, static_argnums=(0, 1))
def student_logp(cfg, shape: Shape, P, theta, pre, flat, spans, at, x, n_new):
    """Log-probs of the student's question and answer rows.
    pre: (k, v, pos) of the system prompt (positions 0..). flat: (k, v, pos, valid) of spans
    that do not depend on the parameters, precompiled and already at the request's positions
    (any order: attention reads positions, not array order). spans: (emb [S, Tb, dim], lens [S],
    start [S], used [S]): each span's token embeddings, length and first row's position in the
    request (its header's, or its first token's); compiled here when shape.compiles_in_path,
    else only a deep trailer's positions are taken from them. With a low-rank correction, emb
    holds each span's hidden state entering the first corrected layer, flat the spans' K/V of
    the layers before it ([lo, S * Tb], span after span, each padded to Tb), and the corrected
    layers are compiled here. at: the position after the last span. x [Nb, dim]: question then
    answer[:-1] rows, n_new valid."""
    pre_k, pre_v, pre_pos = pre
    fk, fv, fpos, fvalid = flat
    emb, lens, start, used = spans
    npre = pre_pos.shape[0]
    h, t = shape.header, shape.trailer
    S, Tb = emb.shape[0], emb.shape[1]
    if shape.lowrank:  # the lower layers as cached, the corrected ones compiled here
        k, v = jax.vmap(lambda e, n: _span_corrected(cfg, shape, P, theta, e, n, pre_k, pre_v,
                                                     pre_pos))(emb, lens)
        L = k.shape[1]
        fk = jnp.concatenate([fk, jnp.moveaxis(k, 0, 1).reshape(L, S * Tb, *k.shape[3:])], 0)
        fv = jnp.concatenate([fv, jnp.moveaxis(v, 0, 1).reshape(L, S * Tb, *v.shape[3:])], 0)
    ks, vs, ps, vals = [pre_k, fk], [pre_v, fv], [pre_pos, fpos], [jnp.ones(npre, bool), fvalid]
    off, valid = _span_offsets(shape, Tb, lens)
    if shape.compiles_in_path:
        k, v = jax.vmap(lambda e, n: _span_rows(cfg, shape, P, theta, e, n, pre_k, pre_v,
                                                pre_pos))(emb, lens)
        L = k.shape[1]
        R = h + Tb + t
        ks.append(jnp.moveaxis(k, 0, 1).reshape(L, S * R, *k.shape[3:]))
        vs.append(jnp.moveaxis(v, 0, 1).reshape(L, S * R, *v.shape[3:]))
        ps.append((start[:, None] + off).reshape(S * R))
        vals.append((valid & used[:, None]).reshape(S * R))
    elif t and shape.depth == "kv":  # the same learned rows after every span
        tk, tv = theta["trailer"]  # [L, t, Hk, hd]
        L = tk.shape[0]
        ks.append(jnp.broadcast_to(tk[:, None], (L, S) + tk.shape[1:]).reshape(L, S * t,
                                                                              *tk.shape[2:]))
        vs.append(jnp.broadcast_to(tv[:, None], (L, S) + tv.shape[1:]).reshape(L, S * t,
                                                                              *tv.shape[2:]))
        ps.append((start[:, None] + lens[:, None] + jnp.arange(t)[None, :]).reshape(S * t))
        vals.append(jnp.repeat(used, t))
    kq = shape.before_question
    if kq and shape.depth == "kv":
        ks.append(theta["question"][0])
        vs.append(theta["question"][1])
        ps.append(at + jnp.arange(kq, dtype=jnp.int32))
        vals.append(jnp.ones(kq, bool))
        rows, skip = x, 0
        first = at + kq
    elif kq:
        rows, skip, first = jnp.concatenate([theta["question"], x], 0), kq, at
    else:
        rows, skip, first = x, 0, at
    ck, cv = jnp.concatenate(ks, 1), jnp.concatenate(vs, 1)
    cpos = jnp.concatenate(ps).astype(jnp.int32)
    cvalid = jnp.concatenate(vals)
    n = rows.shape[0]
    rpos = first + jnp.arange(n, dtype=jnp.int32)
    rvalid = jnp.arange(n) < skip + n_new
    _, _, hid = M.run_rows(cfg, P, rows, rpos, rvalid, ck, cv, cpos, cvalid)
    return jax.nn.log_softmax(M.logits_of(cfg, P, hid[skip:]), axis=-1)


def kl_top(t_ids, t_lp, s_lp):
    """Per row KL(teacher || student) with the teacher's top-K log-probs and the rest of its
    mass as one tail outcome (the student's tail is its mass outside those K ids)."""
    p = jnp.exp(t_lp)
    s_top = jnp.take_along_axis(s_lp, t_ids, axis=-1)
    p_tail = jnp.clip(1.0 - jnp.sum(p, -1), 1e-6, 1.0)
    q_tail = jnp.clip(1.0 - jnp.sum(jnp.exp(s_top), -1), 1e-6, 1.0)
    return jnp.sum(p * (t_lp - s_top), -1) + p_tail * (jnp.log(p_tail) - jnp.log(q_tail))


@functools.partial(jax.jit, static_argnums=(0, 1))
def loss_and_grad(cfg, shape: Shape, P, theta, pre, flat, spans, at, x, n_new, q_len, t_ids,
                  t_lp, w):
    def f(th):
        lp = student_logp(cfg, shape, P, th, pre, flat, spans, at, x, n_new)
        rows = jax.lax.dynamic_slice_in_dim(lp, q_len - 1, t_ids.shape[0], 0)
        kl = kl_top(t_ids, t_lp, rows)
        return jnp.sum(kl * w) / jnp.sum(w)

    return jax.value_and_grad(f)(theta)


GROUPS = ("header", "trailer", "question")  # the file's order of the rows


def _counts(shape: Shape):
    return dict(zip(GROUPS, (shape.header, shape.trailer, shape.before_question)))


def to_file(shape: Shape, theta, model: M.Model):
    """(rows, kv) as adapter.write takes them: header, trailer, then before-question rows."""
    names = [n for n, k in _counts(shape).items() if k]
    if not names:
        return None, None
    if shape.depth == "embedding":
        return np.concatenate([np.asarray(theta[n]) for n in names], 0), None
    c = model.cfg
    parts = []
    for n in names:
        a = np.asarray(theta[n])  # [2, L, k, Hk, hd]
        parts.append(np.transpose(a, (2, 1, 0, 3, 4)).reshape(a.shape[2], c.n_layers, 2,
                                                              c.n_kv_heads * c.head_dim))
    return None, np.concatenate(parts, 0)


def lowrank_to_file(shape: Shape, theta, model: M.Model):
    """The correction as adapter.write takes it: (a [layers, dim, r], b [layers, r, 2 * kv],
    first layer), or None."""
    if not shape.lowrank:
        return None
    c = model.cfg
    b = np.asarray(theta["lowrank_b"]).reshape(shape.lowrank_layers, shape.lowrank,
                                                2 * c.n_kv_heads * c.head_dim)
    return np.asarray(theta["lowrank_a"]), b, shape.first_corrected(c.n_layers)


def from_file(data, meta, model: M.Model):
    """(shape, theta) of an adapter as adapter.read returns it."""
    n = int(meta["relokv.links.rows"])
    h = int(meta.get("relokv.links.header_rows", 0))
    t = int(meta.get("relokv.links.trailer_rows", 0))
    c = model.cfg
    theta, at = {}, 0
    r = int(meta.get("relokv.links.lowrank_rank", 0))
    nl = c.n_layers - int(meta["relokv.links.lowrank_first_layer"]) if r else 0
    shape = Shape(meta.get("relokv.links.depth", "embedding"), h, t, n - h - t, r, nl)
    if r:
        theta["lowrank_a"] = jnp.asarray(meta["links.lowrank_a"])
        theta["lowrank_b"] = jnp.asarray(np.asarray(meta["links.lowrank_b"]).reshape(
            nl, r, 2, c.n_kv_heads, c.head_dim))
    for name, k in _counts(shape).items():
        if not k:
            continue
        if shape.depth == "kv":
            a = np.asarray(data[at:at + k]).reshape(k, c.n_layers, 2, c.n_kv_heads, c.head_dim)
            theta[name] = jnp.asarray(np.transpose(a, (2, 1, 0, 3, 4)))
        else:
            theta[name] = jnp.asarray(data[at:at + k])
        at += k
    return shape, theta
