#!/usr/bin/env python3
"""Trains span links: k learned rows read before the question, the model frozen.

    relokv_rag --model MODEL --requests 200 --export-workload wl.json
    python3 tools/links/train.py --model MODEL --workload wl.json --links 8 \
        --out tools/links/adapters/NAME.gguf

Teacher: the model over the whole prompt (full attention) and its greedy answer. Student: the
same prompt as relokv serves it under naive reuse: each passage's K/V compiled alone behind the
system prompt and relocated by RoPE, then the link rows, the question and the answer computed
afresh. Loss: KL(teacher || student) of the next-token distributions over the answer's rows
(weight 1) and the question's own rows (weight --question-weight). Adam on the link rows only.
The first --held-out requests (the ones the QA program measures on) and their passages are never
trained on. Writes the adapter (GGUF), its loss curve (SVG) and a JSON log beside it.
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
import jax.numpy as jnp  # noqa: E402

from links import adapter, data, pic  # noqa: E402
from links import model as M  # noqa: E402


def teacher_set(runner, w, examples, max_answer, log):
    out = []
    t0 = time.time()
    for i, e in enumerate(examples):
        prompt = list(e.prefix)
        for p in e.passages:
            prompt += w.corpus[p]
        prompt += e.question
        answer, tlp = runner.teacher(prompt, len(e.question), w.end_of_turn, max_answer)
        ctx = runner.relocated(e.prefix, [(p, w.corpus[p]) for p in e.passages])
        out.append((e, answer, tlp, ctx))
        if log and (i + 1) % 10 == 0:
            log(f"  teacher {i + 1}/{len(examples)} ({time.time() - t0:.0f} s)")
    return out


def evaluate(runner, items, links, qw=0.2):
    """Per request: first-token KL, mean KL over the answer's rows, teacher-forced agreement."""
    cfg, P = runner.m.cfg, runner.m.params
    k = 0 if links is None else links.shape[0]
    lk = jnp.zeros((0, cfg.dim)) if links is None else jnp.asarray(links)
    first, ans, agree = [], [], []
    for e, answer, tlp, ctx in items:
        x, pos, valid, n = pic.student_inputs(runner, k, ctx, e.question, answer)
        lp = np.asarray(pic.student_logp(cfg, k, P, lk, x, pos, valid, *ctx.padded()))
        q = len(e.question)
        t = tlp.astype(np.float32)
        s = lp[: t.shape[0]]
        kl = np.sum(np.exp(t) * (t - s), axis=-1)
        first.append(float(kl[q - 1]))
        ans.append(float(np.mean(kl[q - 1:])))
        agree.append(float(np.mean(np.argmax(s[q - 1:], -1) == np.array(answer))))
    return {"first_kl": float(np.mean(first)), "answer_kl": float(np.mean(ans)),
            "tf_agreement": float(np.mean(agree)), "n": len(items)}


def init_links(model, k, seed):
    """Untrained rows: embeddings of k seeded random vocabulary tokens."""
    rng = np.random.default_rng(seed)
    return model.embed(rng.integers(0, model.cfg.vocab, k))


def train(runner, items, links, steps, lr, qw, time_limit, log, seed=0):
    cfg, P = runner.m.cfg, runner.m.params
    k = links.shape[0]
    links = jnp.asarray(links)
    m1 = jnp.zeros_like(links)
    m2 = jnp.zeros_like(links)
    b1, b2, eps = 0.9, 0.999, 1e-8
    rng = np.random.default_rng(seed)
    curve = []
    t0 = time.time()
    order = []
    for step in range(1, steps + 1):
        if not order:
            order = list(rng.permutation(len(items)))
        e, answer, tlp, ctx = items[order.pop()]
        x, pos, valid, n = pic.student_inputs(runner, k, ctx, e.question, answer)
        w = jnp.asarray(pic.row_weights(len(e.question), len(answer), qw))
        loss, g = pic.loss_and_grad(cfg, k, P, links, x, pos, valid, *ctx.padded(),
                                    jnp.asarray(tlp.astype(np.float32)), w)
        a = lr * min(1.0, step / 20) * 0.5 * (1 + np.cos(np.pi * step / steps))  # warmup, cosine
        m1 = b1 * m1 + (1 - b1) * g
        m2 = b2 * m2 + (1 - b2) * g * g
        links = links - a * (m1 / (1 - b1 ** step)) / (jnp.sqrt(m2 / (1 - b2 ** step)) + eps)
        curve.append(float(loss))
        if step % 25 == 0 or step == steps:
            log(f"  step {step}/{steps}: loss {np.mean(curve[-25:]):.4f} "
                f"({time.time() - t0:.0f} s)")
        if time_limit and time.time() - t0 > time_limit:
            log(f"  time limit reached at step {step}")
            break
    return np.asarray(links), curve


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the GGUF the engine serves")
    ap.add_argument("--workload", required=True, help="relokv_rag --export-workload's JSON")
    ap.add_argument("--links", type=int, default=8, help="link rows before the question")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.01, help="Adam's rate (relative to row scale)")
    ap.add_argument("--question-weight", type=float, default=0.2)
    ap.add_argument("--held-out", type=int, default=60,
                    help="the first N requests (and their passages) are never trained on")
    ap.add_argument("--max-train", type=int, default=140, help="training prompts at most")
    ap.add_argument("--eval", type=int, default=24, help="held-out requests evaluated")
    ap.add_argument("--max-answer", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=0, help="training seconds at most")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="the adapter (GGUF); .svg and .json beside it")
    a = ap.parse_args()

    def log(s):
        print(s, flush=True)

    t_start = time.time()
    model = M.load(a.model)
    runner = pic.Runner(model)
    w = data.load(a.workload)
    if w.end_of_turn < 0:
        sys.exit("the workload has no end-of-turn token (exported from the synthetic model?)")
    tr, held = data.split(w, held_out=a.held_out, max_train=a.max_train, seed=a.seed)
    log(f"{model.cfg.arch} dim {model.cfg.dim}: {len(tr)} training prompts, "
        f"{min(a.eval, len(held))} held-out")
    t0 = time.time()
    train_items = teacher_set(runner, w, tr, a.max_answer, log)
    held_items = teacher_set(runner, w, held[: a.eval], a.max_answer, None)
    t_teacher = time.time() - t0
    log(f"teacher and spans: {t_teacher:.0f} s")
    init = init_links(model, a.links, a.seed)
    before = {"naive": evaluate(runner, held_items, None),
              "untrained": evaluate(runner, held_items, init)}
    log(f"held out before: {json.dumps(before)}")
    t0 = time.time()
    links, curve = train(runner, train_items, init, a.steps, a.lr * float(np.std(init)),
                         a.question_weight, a.time_limit, log, a.seed)
    t_train = time.time() - t0
    after = evaluate(runner, held_items, links)
    train_eval = evaluate(runner, train_items[: a.eval], links)
    log(f"held out after: {json.dumps(after)}; train {json.dumps(train_eval)}")
    with open(a.model, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()
    command = "python3 tools/links/train.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()
        if k not in ("model", "workload", "out")) + f" --model {os.path.basename(a.model)}"
    adapter.write(a.out, links, model, model_sha, placement="before_question",
                  info={"command": command, "held_out": a.held_out,
                        "steps": len(curve), "train_seconds": round(t_train, 1)})
    stem = os.path.splitext(a.out)[0]
    adapter.loss_svg(stem + ".svg", curve, f"{os.path.basename(a.model)}: {a.links} link rows")
    with open(stem + ".json", "w") as f:
        json.dump({"model": os.path.basename(a.model), "model_sha256": model_sha,
                   "links": a.links, "steps": len(curve), "lr": a.lr, "command": command,
                   "train_prompts": len(tr), "held_out_evaluated": len(held_items),
                   "teacher_seconds": round(t_teacher, 1), "train_seconds": round(t_train, 1),
                   "total_seconds": round(time.time() - t_start, 1),
                   "held_out": {**before, "trained": after}, "train": train_eval,
                   "loss": [round(x, 5) for x in curve]}, f, indent=1)
    log(f"wrote {a.out} ({time.time() - t_start:.0f} s in all)")


if __name__ == "__main__":
    main()
