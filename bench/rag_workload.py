#!/usr/bin/env python3
"""RAG workloads at real lengths from the shipped 2WikiMultihopQA sample, as plain prompts.

A conversation is a question of the sample drawn with Zipf popularity, its passages in a fresh
random order inside the message text as a RAG client formats them (bench/serve_load.py's
SUITE: LangChain's "stuff" prompt by default), and with --turns 2 a follow-up turn over the
same passages. With --docs 20 a prompt holds the question's ten passages and ten more drawn from
the pool of every passage in the sample with Zipf popularity (popular across questions, as
retrieved passages are). Writes, deterministically for a seed:

  --out FILE     the conversations as JSON ({"key", "turns": [text, ...], "max_tokens"}), which
                 bench/serve_load.py --workload replays (agreement with full recompute);
  --aiperf FILE  the same as aiperf's custom dataset (single_turn or multi_turn JSONL).
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_load import ROOT, SUITE, render  # noqa: E402

FOLLOW_UP = "Which of the passages above supports your answer? Name its title."


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def build(sample, n, docs, zipf, seed, fmt, turns, max_tokens):
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** zipf for i in range(len(sample))]
    pool, seen = [], set()
    for rec in sample:
        for title, sentences in rec["context"]:
            if title not in seen:
                seen.add(title)
                pool.append((title, " ".join(sentences)))
    # Popularity over the pool: a seeded ranking, Zipf weights over it.
    rank = list(range(len(pool)))
    rng.shuffle(rank)
    pool_weights = [0.0] * len(pool)
    for r, i in enumerate(rank):
        pool_weights[i] = 1.0 / (r + 1) ** zipf
    out = []
    for k in range(n):
        q = rng.choices(range(len(sample)), weights)[0]
        own = [(t, " ".join(s)) for t, s in sample[q]["context"]][:docs]
        titles = {t for t, _ in own}
        extra = []
        while len(own) + len(extra) < docs and len(titles) < len(pool):
            i = rng.choices(range(len(pool)), pool_weights)[0]
            if pool[i][0] not in titles:
                titles.add(pool[i][0])
                extra.append(pool[i])
        ctx = own + extra
        rng.shuffle(ctx)
        text = render(SUITE[fmt], [{"title": t, "text": body} for t, body in ctx],
                      sample[q]["question"], k)
        conv = {"key": f"{q}:{k}", "turns": [text], "max_tokens": max_tokens}
        if turns > 1:
            conv["turns"] += [FOLLOW_UP] * (turns - 1)
        out.append(conv)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", default=os.path.join(ROOT, "data", "2wikimqa_dev_sample200.jsonl"))
    ap.add_argument("--requests", type=int, default=32, help="conversations")
    ap.add_argument("--questions", type=int, default=40, help="distinct questions drawn from")
    ap.add_argument("--docs", type=int, default=10, help="passages per prompt (10 or 20)")
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--format", default="langchain", choices=sorted(SUITE))
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", help="conversations as JSON (bench/serve_load.py --workload)")
    ap.add_argument("--aiperf", help="aiperf's custom dataset (JSONL)")
    a = ap.parse_args()
    if a.docs < 1 or a.requests < 1 or a.turns < 1:
        ap.error("--docs, --requests and --turns must be positive")
    convs = build(load(a.sample)[:a.questions], a.requests, a.docs, a.zipf, a.seed, a.format,
                  a.turns, a.max_tokens)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(convs, f)
    if a.aiperf:
        with open(a.aiperf, "w") as f:
            for c in convs:
                turns = [{"text": t, "output_length": c["max_tokens"]} for t in c["turns"]]
                if len(turns) == 1:
                    f.write(json.dumps({"type": "single_turn", **turns[0]}) + "\n")
                else:
                    f.write(json.dumps({"type": "multi_turn", "session_id": c["key"],
                                        "turns": turns}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
