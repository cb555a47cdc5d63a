"""Teacher and student of the link distillation, on the JAX model.

teacher: the model over the whole prompt (system, passages in the request's order, question)
and its own greedy answer: full attention, what relokv's `full` serves.
student: what relokv serves under naive reuse with links: the system prompt computed, each
passage's keys and values as compiled alone behind the system prompt (keys unrotated, RoPE at
the reading request's positions), then `k` learned link rows, the question and the answer
computed afresh over all of it. Only the link rows are trained; the model is frozen.

Shapes are padded to buckets so that XLA compiles a handful of programs, not one per prompt.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from . import model as M

KV_DTYPE = ml_dtypes.bfloat16  # what the engine's pool holds by default


def bucket(n: int, step: int) -> int:
    return max(step, (n + step - 1) // step * step)


@functools.partial(jax.jit, static_argnums=0)
def _rows(cfg, P, x, pos, valid, ck, cv, cpos, cvalid):
    return M.run_rows(cfg, P, x, pos, valid, ck, cv, cpos, cvalid)


@functools.partial(jax.jit, static_argnums=0)
def _rows_logits(cfg, P, x, pos, valid, ck, cv, cpos, cvalid):
    k, v, h = M.run_rows(cfg, P, x, pos, valid, ck, cv, cpos, cvalid)
    return k, v, jax.nn.log_softmax(M.logits_of(cfg, P, h), axis=-1)


@functools.partial(jax.jit, static_argnums=0)
def _logp(cfg, P, h):
    return jax.nn.log_softmax(M.logits_of(cfg, P, h), axis=-1)


class Context:
    """Keys (unrotated) and values of rows at positions, padded for the jitted calls."""

    def __init__(self, k, v, pos):
        self.k, self.v, self.pos = k, v, np.asarray(pos, np.int32)  # k, v: [L, m, Hk, hd]

    @property
    def size(self):
        return len(self.pos)

    def padded(self, step=256):
        m = self.size
        mb = bucket(m, step) if m else 0
        L, _, Hk, hd = self.k.shape
        k = np.zeros((L, mb, Hk, hd), np.float32)
        v = np.zeros((L, mb, Hk, hd), np.float32)
        k[:, :m] = self.k
        v[:, :m] = self.v
        pos = np.zeros(mb, np.int32)
        pos[:m] = self.pos
        valid = np.zeros(mb, bool)
        valid[:m] = True
        return jnp.asarray(k), jnp.asarray(v), jnp.asarray(pos), jnp.asarray(valid)

    @staticmethod
    def cat(parts):
        return Context(np.concatenate([p.k for p in parts], axis=1),
                       np.concatenate([p.v for p in parts], axis=1),
                       np.concatenate([p.pos for p in parts]))


class Runner:
    def __init__(self, model: M.Model):
        self.m = model
        c = model.cfg
        self.empty = Context(np.zeros((c.n_layers, 0, c.n_kv_heads, c.head_dim), np.float32),
                             np.zeros((c.n_layers, 0, c.n_kv_heads, c.head_dim), np.float32),
                             np.zeros(0, np.int32))
        self._span_cache = {}
        self._prefix = None

    def run(self, x, pos, ctx: Context, step=32, logits=False, P=None):
        """Rows x [n, dim] at pos over ctx; returns (k, v) of the rows as numpy [L, n, ..] and
        their hidden states, or log-probs when `logits`. P: the model's layers (default all;
        model.layers(P, lo, hi) a range, with ctx holding the same layers)."""
        n = x.shape[0]
        nb = bucket(n, step)
        xp = np.zeros((nb, x.shape[1]), np.float32)
        xp[:n] = x
        pp = np.zeros(nb, np.int32)
        pp[:n] = pos
        valid = np.zeros(nb, bool)
        valid[:n] = True
        f = _rows_logits if logits else _rows
        k, v, out = f(self.m.cfg, self.m.params if P is None else P, jnp.asarray(xp),
                      jnp.asarray(pp), jnp.asarray(valid), *ctx.padded())
        return np.asarray(k)[:, :n], np.asarray(v)[:, :n], np.asarray(out)[:n]

    def prefix(self, tokens):
        if self._prefix is None:
            k, v, _ = self.run(self.m.embed(tokens), np.arange(len(tokens)), self.empty)
            self._prefix = Context(k, v, np.arange(len(tokens)))
        return self._prefix

    def span(self, key, tokens, prefix):
        """A passage compiled behind the system prompt (relokv's --compile-behind prompt): its
        K (unrotated) and V in the pool's type, at its compile positions."""
        if key not in self._span_cache:
            pre = self.prefix(prefix)
            pos = pre.size + np.arange(len(tokens))
            k, v, _ = self.run(self.m.embed(tokens), pos, pre)
            self._span_cache[key] = (k.astype(KV_DTYPE), v.astype(KV_DTYPE))
        return self._span_cache[key]

    def span_lower(self, key, tokens, prefix, lo):
        """A passage's compile behind the system prompt through layer lo - 1 (what a low-rank
        correction of the later layers does not change): its K/V of layers < lo in the pool's
        type, and the hidden state entering layer lo."""
        if (key, lo) not in self._span_cache:
            pre = self.prefix(prefix)
            pos = pre.size + np.arange(len(tokens))
            k, v, x = self.run(self.m.embed(tokens), pos, Context(pre.k[:lo], pre.v[:lo], pre.pos),
                               P=M.layers(self.m.params, 0, lo))
            self._span_cache[(key, lo)] = (k.astype(KV_DTYPE), v.astype(KV_DTYPE), x)
        return self._span_cache[(key, lo)]

    def relocated(self, prefix, spans):
        """The student's context: the system prompt, then each span's cached K/V at the
        positions the request gives it (RoPE at attention relocates them)."""
        parts = [self.prefix(prefix)]
        at = len(prefix)
        for key, tokens in spans:
            k, v = self.span(key, tokens, prefix)
            parts.append(Context(k.astype(np.float32), v.astype(np.float32),
                                 at + np.arange(len(tokens))))
            at += len(tokens)
        return Context.cat(parts)

    def teacher(self, prompt, question_len, stop, max_answer=16):
        """Full attention over the prompt, its greedy answer (up to max_answer tokens, the stop
        token included) and the log-probs [question_len + len(answer) - 1... ] at the rows that
        predict the question's later tokens and every answer token."""
        n = len(prompt)
        k, v, h = self.run(self.m.embed(prompt), np.arange(n), self.empty, step=256)
        # Log-probs of the question's rows only (the vocabulary's product over every prompt row
        # would cost more than the prompt: Gemma's 262k rows).
        qh = np.zeros((bucket(question_len, 32), h.shape[1]), np.float32)
        qh[:question_len] = h[n - question_len:]
        lp = np.asarray(_logp(self.m.cfg, self.m.params, jnp.asarray(qh)))
        rows = [lp[i] for i in range(question_len)]
        ctx = Context(k, v, np.arange(n))
        answer = []
        t = int(np.argmax(rows[-1]))
        while True:
            answer.append(t)
            if t == stop or len(answer) == max_answer:
                break
            k1, v1, lp1 = self.run(self.m.embed([t]), np.array([ctx.size]), ctx, step=1,
                                   logits=True)
            ctx = Context(np.concatenate([ctx.k, k1], 1), np.concatenate([ctx.v, v1], 1),
                          np.append(ctx.pos, ctx.size))
            rows.append(lp1[0])
            t = int(np.argmax(lp1[0]))
        return answer, np.stack(rows).astype(np.float16)


@functools.partial(jax.jit, static_argnums=(0, 1))
def student_logp(cfg, k_links, P, links, x, pos, valid, ck, cv, cpos, cvalid):
    """Log-probs at the rows after the links: links [k, dim] then x (question and answer rows,
    padded) at positions pos (the links' first, then consecutive)."""
    xs = jnp.concatenate([links, x], axis=0) if k_links else x
    _, _, h = M.run_rows(cfg, P, xs, pos, valid, ck, cv, cpos, cvalid)
    return jax.nn.log_softmax(M.logits_of(cfg, P, h[k_links:]), axis=-1)


def kl_rows(teacher_lp, student_lp, weights):
    """Weighted mean over rows of KL(teacher || student), in nats."""
    p = jnp.exp(teacher_lp)
    kl = jnp.sum(p * (teacher_lp - student_lp), axis=-1)
    return jnp.sum(kl * weights) / jnp.maximum(jnp.sum(weights), 1e-9)


@functools.partial(jax.jit, static_argnums=(0, 1))
def loss_and_grad(cfg, k_links, P, links, x, pos, valid, ck, cv, cpos, cvalid, tlp, w):
    def f(links):
        lp = student_logp(cfg, k_links, P, links, x, pos, valid, ck, cv, cpos, cvalid)
        return kl_rows(tlp, lp[: tlp.shape[0]], w)

    return jax.value_and_grad(f)(links)


def student_inputs(runner: Runner, k_links: int, ctx: Context, question, answer,
                   step=32):
    """Padded inputs of the student's new rows: question then answer[:-1] after k link rows."""
    toks = list(question) + list(answer[:-1])
    x = runner.m.embed(toks)
    n = len(toks)
    total = bucket(k_links + n, step)
    xp = np.zeros((total - k_links, x.shape[1]), np.float32)
    xp[:n] = x
    pos = ctx.size + np.arange(total, dtype=np.int32)
    valid = np.zeros(total, bool)
    valid[: k_links + n] = True
    return jnp.asarray(xp), jnp.asarray(pos), jnp.asarray(valid), n


def row_weights(question_len, answer_len, question_weight=0.2):
    """The loss's rows: the question's own next tokens count question_weight; the rows that
    predict answer tokens (the question's last row on) count 1."""
    w = np.full(question_len + answer_len - 1, question_weight, np.float32)
    w[question_len - 1:] = 1.0
    return w
