#!/usr/bin/env python3
"""Trains an adapter of any depth and placement (links/student.py) by distillation from a teacher
that relokv's own engine computed once (relokv_teacher), on a prompt set (links/corpus.py).

    relokv_rag --model M --requests 200 --export-workload wl.json
    python3 -m links.corpus --workload wl.json --out prompts.json          (in tools/links)
    relokv_teacher --model M --workload wl.json --prompts prompts.json --out teacher.jsonl
    python3 tools/links/distill.py --model M --workload wl.json --prompts prompts.json \
        --teacher teacher.jsonl --depth kv --links 16 --out A.gguf

Loss: KL(teacher || student) over the teacher's greedy answer (relokv_teacher --answer, 32
tokens by default: every row predicting an answer token, the first counted twice), with the
teacher's top log-probs and its remaining mass as one outcome. Adam on the rows only, warmup
and cosine; the validation prompts (other questions than the training ones; never the measured
questions or their passages) are scored every --eval-every steps and the best rows are kept
(early stopping after --patience evaluations without a gain). --time-limit bounds the training
(default 2 hours, the budget per adapter on two cores). Writes the adapter (GGUF), its curves
(SVG: training loss, validation loss) and a JSON log beside it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from links import adapter, pic, student  # noqa: E402
from links import model as M  # noqa: E402
from links.pic import bucket  # noqa: E402

MAX_SPANS = 10


def load_teacher(path):
    """{prompt index: (answer, top ids, top log-probs)} of relokv_teacher's lines (a line cut
    short by a stop is skipped); a line that is not one is refused with its file and number."""
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip().endswith("}"):
                continue
            try:
                j = json.loads(line)
                out[int(j["i"])] = (np.array(j["answer"], np.int32),
                                    np.array(j["top_ids"], np.int32),
                                    np.array(j["top_logp"], np.float32))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a relokv_teacher line ({e})") from None
    return out


class Examples:
    """Builds the student's padded inputs of one prompt."""

    def __init__(self, model, runner, w, shape: student.Shape):
        self.m, self.r, self.w, self.shape = model, runner, w, shape
        pre = runner.prefix(w["prefix"])
        self.pre = (jnp.asarray(pre.k), jnp.asarray(pre.v), jnp.asarray(pre.pos))
        self.npre = pre.size

    def build(self, prompt, teacher):
        shape, m, w = self.shape, self.m, self.w
        corpus = w["corpus"]
        toks = [corpus[p]["tokens"] for p in prompt["passages"]]
        S = len(toks)
        h, t = shape.header, shape.trailer
        lens = np.array([len(x) for x in toks], np.int32)
        start = self.npre + np.concatenate([[0], np.cumsum(h + lens + t)[:-1]]).astype(np.int32)
        at = int(self.npre + np.sum(h + lens + t))
        c = m.cfg
        Sb = MAX_SPANS if not (shape.compiles_in_path or shape.lowrank) else bucket(S, 2)
        if shape.lowrank:
            # The layers below the correction as cached; the hidden state entering it. Coarse
            # buckets: every (spans, span length, rows) shape is a program of its own, and a run
            # that compiled too many of them ran out of memory mapped for code.
            Sb = bucket(S, 5)
            lo = shape.first_corrected(c.n_layers)
            Tb = bucket(int(lens.max()), 128)
            emb = np.zeros((Sb, Tb, c.dim), np.float32)
            fk = np.zeros((lo, Sb * Tb, c.n_kv_heads, c.head_dim), np.float32)
            fv = np.zeros_like(fk)
            fpos = np.zeros(Sb * Tb, np.int32)
            fvalid = np.zeros(Sb * Tb, bool)
            for i, p in enumerate(prompt["passages"]):
                k, v, xm = self.r.span_lower(p, toks[i], w["prefix"], lo)
                n, at0 = len(toks[i]), i * Tb
                emb[i, :n] = xm
                fk[:, at0:at0 + n] = k.astype(np.float32)
                fv[:, at0:at0 + n] = v.astype(np.float32)
                fpos[at0:at0 + Tb] = start[i] + h + np.arange(Tb)
                fvalid[at0:at0 + n] = True
            flat = (fk, fv, fpos, fvalid)
        elif shape.compiles_in_path:
            Tb = bucket(int(lens.max()), 64)
            emb = np.zeros((Sb, Tb, c.dim), np.float32)
            for i, x in enumerate(toks):
                emb[i, : len(x)] = m.embed(x)
            flat = (np.zeros((c.n_layers, 0, c.n_kv_heads, c.head_dim), np.float32),) * 2 + (
                np.zeros(0, np.int32), np.zeros(0, bool))
        else:
            emb = np.zeros((Sb, 1, c.dim), np.float32)
            ks, vs, ps = [], [], []
            for i, p in enumerate(prompt["passages"]):
                k, v = self.r.span(p, toks[i], w["prefix"])
                ks.append(k.astype(np.float32))
                vs.append(v.astype(np.float32))
                ps.append(start[i] + h + np.arange(len(toks[i]), dtype=np.int32))
            k = np.concatenate(ks, 1)
            n = k.shape[1]
            nb = bucket(n, 256)
            fk = np.zeros((c.n_layers, nb, c.n_kv_heads, c.head_dim), np.float32)
            fv = np.zeros_like(fk)
            fk[:, :n] = k
            fv[:, :n] = np.concatenate(vs, 1)
            fpos = np.zeros(nb, np.int32)
            fpos[:n] = np.concatenate(ps)
            flat = (fk, fv, fpos, np.arange(nb) < n)
        lens_p = np.zeros(Sb, np.int32)
        lens_p[:S] = lens
        start_p = np.zeros(Sb, np.int32)
        start_p[:S] = start
        used = np.arange(Sb) < S
        answer, t_ids, t_lp = teacher
        q = prompt["question_tokens"]
        rows = list(q) + list(answer[:-1])
        xb = bucket(len(rows), 32)
        x = np.zeros((xb, c.dim), np.float32)
        x[: len(rows)] = m.embed(rows)
        wts = np.ones(len(answer), np.float32)
        wts[0] = 2.0
        return dict(flat=tuple(jnp.asarray(a) for a in flat),
                    spans=(jnp.asarray(emb), jnp.asarray(lens_p), jnp.asarray(start_p),
                           jnp.asarray(used)),
                    at=jnp.int32(at), x=jnp.asarray(x), n_new=jnp.int32(len(rows)),
                    q_len=jnp.int32(len(q)), t_ids=jnp.asarray(t_ids), t_lp=jnp.asarray(t_lp),
                    w=jnp.asarray(wts), answer=answer)


def selection(prompts, corpus, has_teacher, *, seed, max_train, n_val, max_passages,
              max_passage_tokens):
    """(training prompts in training order, validation prompts). The order is a seeded shuffle
    of every fitting training prompt, whichever have a teacher, so a teacher run over part of the
    set (relokv_teacher --only, or one stopped early) trains on the prompts the whole set would
    give, in the same order, less those without a teacher."""
    def fits(p):
        return (len(p["passages"]) <= max_passages and
                max(len(corpus[i]["tokens"]) for i in p["passages"]) <= max_passage_tokens)

    cand = [i for i, p in enumerate(prompts) if p["split"] == "train" and fits(p)]
    np.random.default_rng(seed).shuffle(cand)
    train = [i for i in cand if has_teacher(i)]
    if max_train:
        train = train[:max_train]
    val = [i for i, p in enumerate(prompts) if p["split"] == "validation" and has_teacher(i)]
    return train, val[:n_val]


def warm_start(path, model_sha, model, shape: student.Shape, theta):
    """The parameters of a trained adapter, for a run that starts from them: it must be of the
    same model (model_sha: its file's SHA-256) and the same shape (depth, every count, the
    correction's rank and layers); the untrained theta gives the structure they must fill."""
    data, meta = adapter.read(path)
    if meta.get("relokv.links.model_sha256") != model_sha:
        raise ValueError("it was trained for another model file")
    got, th = student.from_file(data, meta, model)
    if got != shape:
        raise ValueError(f"its shape {got} is not the run's {shape}")
    for k, v in theta.items():
        if k not in th or th[k].shape != v.shape:
            raise ValueError(f"its {k} does not match the run's")
    return {k: jnp.asarray(th[k], jnp.float32) for k in theta}


def score(ex, shape, P, cfg, theta, items):
    """Mean validation loss, first-token KL, answer KL and teacher-forced agreement."""
    loss, first, ans, agree = [], [], [], []
    for it in items:
        lp = student.student_logp(cfg, shape, P, theta, ex.pre, it["flat"], it["spans"], it["at"],
                                  it["x"], it["n_new"])
        q = int(it["q_len"])
        rows = lp[q - 1: q - 1 + it["t_ids"].shape[0]]
        kl = np.asarray(student.kl_top(it["t_ids"], it["t_lp"], rows))
        w = np.asarray(it["w"])
        loss.append(float(np.sum(kl * w) / np.sum(w)))
        first.append(float(kl[0]))
        ans.append(float(np.mean(kl)))
        agree.append(float(np.mean(np.argmax(np.asarray(rows), -1) == it["answer"])))
    return {"loss": float(np.mean(loss)), "first_kl": float(np.mean(first)),
            "answer_kl": float(np.mean(ans)), "tf_agreement": float(np.mean(agree)),
            "n": len(items)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--teacher", help="relokv_teacher's JSON lines (required to train)")
    ap.add_argument("--depth", choices=("embedding", "kv"), default="kv")
    ap.add_argument("--links", type=int, default=16, help="rows before the question")
    ap.add_argument("--header", type=int, default=0, help="rows before each span")
    ap.add_argument("--trailer", type=int, default=0, help="rows after each span")
    ap.add_argument("--lowrank", type=int, default=0,
                    help="rank of a deep low-rank correction of each span's K/V (0: none)")
    ap.add_argument("--lowrank-layers", type=int, default=0,
                    help="the last layers the correction changes (default: a quarter)")
    ap.add_argument("--max-train", type=int, default=0, help="training prompts at most (0: all)")
    ap.add_argument("--max-passages", type=int, default=MAX_SPANS,
                    help="train on prompts of at most this many passages")
    ap.add_argument("--max-passage-tokens", type=int, default=100000,
                    help="train on prompts whose passages are at most this long")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=0.02, help="Adam's rate relative to the rows' scale")
    ap.add_argument("--val", type=int, default=64, help="validation prompts scored")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=7200.0, help="training seconds at most")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init", metavar="ADAPTER",
                    help="start from this adapter's parameters (same model and shape) instead "
                         "of the untrained ones: a curriculum (short prompts, then long) or a "
                         "run continued past a session (warm-up and cosine start again)")
    ap.add_argument("--selection", metavar="OUT",
                    help="write the indices of the prompts this run trains and validates on (a "
                         "JSON array, for relokv_teacher --only) and exit: no teacher needed")
    ap.add_argument("--out")
    a = ap.parse_args()
    if not a.selection and not (a.teacher and a.out):
        ap.error("--teacher and --out are required to train (or --selection OUT)")

    def log(s):
        print(s, flush=True)

    t_start = time.time()
    with open(a.workload) as f:
        w = json.load(f)
    with open(a.prompts) as f:
        ps = json.load(f)
    corpus = w["corpus"]

    def select(has_teacher):
        return selection(ps["prompts"], corpus, has_teacher, seed=a.seed, max_train=a.max_train,
                         n_val=a.val, max_passages=a.max_passages,
                         max_passage_tokens=a.max_passage_tokens)

    if a.selection:
        train, val = select(lambda i: True)
        with open(a.selection, "w") as f:
            json.dump(sorted(train + val), f)
        log(f"wrote {a.selection}: {len(train)} training and {len(val)} validation prompts")
        return
    model = M.load(a.model)
    nl = (a.lowrank_layers or max(1, model.cfg.n_layers // 4)) if a.lowrank else 0
    try:
        shape = student.Shape(a.depth, a.header, a.trailer, a.links, a.lowrank, nl)
    except ValueError as e:
        sys.exit(f"distill: {e}")
    if shape.rows == 0 and not shape.lowrank:
        sys.exit("distill: nothing to train (--links, --header, --trailer, --lowrank)")
    if nl > model.cfg.n_layers:
        sys.exit(f"distill: --lowrank-layers {nl}: the model has {model.cfg.n_layers} layers")
    cfg, P = model.cfg, model.params
    runner = pic.Runner(model)
    try:
        teacher = load_teacher(a.teacher)
    except (OSError, ValueError) as e:
        sys.exit(f"distill: --teacher: {e}")
    train, val = select(lambda i: i in teacher)
    if not train or not val:
        sys.exit(f"distill: {len(train)} training and {len(val)} validation prompts with a "
                 "teacher (run relokv_teacher over the prompt set)")
    log(f"{cfg.arch} dim {cfg.dim}: {shape}, {len(train)} training prompts, {len(val)} "
        "validation")
    ex = Examples(model, runner, w, shape)
    pre = ex.pre
    seen = sorted({p for i in train for p in ps["prompts"][i]["passages"]})
    theta = student.init(model, shape, [corpus[p]["tokens"] for p in seen], pre[:2], a.seed)
    with open(a.model, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()
    if a.init:
        try:
            theta = warm_start(a.init, model_sha, model, shape, theta)
        except ValueError as e:
            sys.exit(f"distill: --init {a.init}: {e}")
        log(f"started from {a.init}")
    val_items = [ex.build(ps["prompts"][i], teacher[i]) for i in val]
    scale = jax.tree_util.tree_map(lambda x: float(jnp.std(x)), theta)
    if shape.lowrank:
        # b starts at zero: its steps are sized so that a step of every coordinate (Adam's, at
        # the peak rate) moves a key or value by about lr / 2 of the corrected layers' K or V
        # spread (the system prompt's), whatever the size of h a (measured on the system
        # prompt at the first corrected layer) and the rank.
        lo = shape.first_corrected(cfg.n_layers)
        pt = w["prefix"]
        none = np.zeros((lo, 0) + tuple(pre[0].shape[2:]), np.float32)
        _, _, xm = runner.run(model.embed(pt), np.arange(len(pt)),
                              pic.Context(none, none, np.zeros(0, np.int32)),
                              P=M.layers(P, 0, lo))
        hm = np.asarray(M._rms(jnp.asarray(xm), P["layers"]["attn_norm"][lo], cfg.eps))
        t_rms = float(np.sqrt(np.mean((hm @ np.asarray(theta["lowrank_a"][0])) ** 2)))
        spread = np.array([float(jnp.std(pre[0][lo:])), float(jnp.std(pre[1][lo:]))])
        scale["lowrank_b"] = jnp.asarray(0.5 * spread / (t_rms * np.sqrt(shape.lowrank))).reshape(
            1, 1, 2, 1, 1)
        log(f"correction: |h a| {t_rms:.3g} at layer {lo}, K/V spread {spread[0]:.3g} / "
            f"{spread[1]:.3g}: b's step scale {np.asarray(scale['lowrank_b']).ravel().tolist()}")
    before = score(ex, shape, P, cfg, theta, val_items)
    log(f"validation before: {json.dumps(before)}")
    command = "python3 tools/links/distill.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()
        if k not in ("model", "workload", "prompts", "teacher", "out")) + \
        f" --model {os.path.basename(a.model)}"
    stem = os.path.splitext(a.out)[0]

    def save(stop):
        """The best adapter so far, its curves and log: at every new best validation loss (a
        run that dies leaves its best) and at the end."""
        theta_b = best[1]
        t_train = time.time() - t0
        rows, kv = student.to_file(shape, theta_b, model)
        info = {"command": command, "held_out": ps["held_out"], "steps": len(curve),
                "best_step": best[2], "train_seconds": round(t_train, 1),
                "train_prompts": len(train)}
        adapter.write(a.out, rows, model, model_sha, placement=shape.placement, info=info,
                      header=shape.header, trailer=shape.trailer, kv=kv,
                      lowrank=student.lowrank_to_file(shape, theta_b, model), depth=shape.depth)
        adapter.loss_svg(stem + ".svg", curve,
                         f"{os.path.basename(a.model)}: {shape.depth} rows, {shape.header} "
                         f"header, {shape.trailer} trailer, {shape.before_question} before the "
                         "question" + (f", rank-{shape.lowrank} correction of the last "
                                       f"{shape.lowrank_layers} layers" if shape.lowrank else ""),
                         val_curve)
        with open(stem + ".json", "w") as f:
            json.dump({"model": os.path.basename(a.model), "model_sha256": model_sha,
                       "shape": vars(shape) if hasattr(shape, "__dict__") else str(shape),
                       "command": command, "train_prompts": len(train),
                       "validation_prompts": len(val), "steps": len(curve),
                       "best_step": best[2], "stop": stop, "train_seconds": round(t_train, 1),
                       "total_seconds": round(time.time() - t_start, 1),
                       "validation": {"before": before, "best": best[3]},
                       "validation_curve": val_curve,
                       "loss": [round(x, 5) for x in curve]}, f, indent=1)

    m1 = jax.tree_util.tree_map(jnp.zeros_like, theta)
    m2 = jax.tree_util.tree_map(jnp.zeros_like, theta)
    b1, b2, eps = 0.9, 0.999, 1e-8
    steps = max(1, int(round(a.epochs * len(train))))
    curve, val_curve = [], [(0, before["loss"])]
    best = (before["loss"], theta, 0, before)
    bad = 0
    t0 = time.time()
    step = 0
    stop = ""
    while step < steps:
        i = train[step % len(train)]
        it = ex.build(ps["prompts"][i], teacher[i])
        step += 1
        loss, g = student.loss_and_grad(cfg, shape, P, theta, pre, it["flat"], it["spans"],
                                        it["at"], it["x"], it["n_new"], it["q_len"], it["t_ids"],
                                        it["t_lp"], it["w"])
        lr = a.lr * min(1.0, step / 50) * 0.5 * (1 + np.cos(np.pi * step / steps))
        m1 = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m1, g)
        m2 = jax.tree_util.tree_map(lambda m, g: b2 * m + (1 - b2) * g * g, m2, g)
        theta = jax.tree_util.tree_map(
            lambda th, m, v, s: th - lr * s * (m / (1 - b1 ** step)) /
            (jnp.sqrt(v / (1 - b2 ** step)) + eps), theta, m1, m2, scale)
        curve.append(float(loss))
        if step % 50 == 0:
            log(f"  step {step}/{steps}: loss {np.mean(curve[-50:]):.4f} ({time.time() - t0:.0f} s)")
        over = a.time_limit and time.time() - t0 > a.time_limit
        if step % a.eval_every == 0 or step == steps or over:
            v = score(ex, shape, P, cfg, theta, val_items)
            val_curve.append((step, v["loss"]))
            log(f"  validation at {step}: {json.dumps(v)}")
            if v["loss"] < best[0]:
                best, bad = (v["loss"], theta, step, v), 0
                save(f"running: best so far at step {step}")
            else:
                bad += 1
                if bad >= a.patience:
                    stop = f"early stop at step {step}"
                    break
        if over:
            stop = f"time limit at step {step}"
            break
    save(stop or f"{steps} steps")
    log(stop or f"{steps} steps")
    log(f"wrote {a.out} (best at step {best[2]}: {json.dumps(best[3])}; "
        f"{time.time() - t_start:.0f} s in all)")


if __name__ == "__main__":
    main()
