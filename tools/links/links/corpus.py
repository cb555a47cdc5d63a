"""The trainer's prompt sets, built from an exported workload (relokv_rag --export-workload).

The measured questions are the workload's first `held_out` requests (the QA program's
`--requests N` takes the first N); neither they nor any passage they show is ever trained or
validated on. The other requests' questions are split by question into training and validation
(no question in both). Each question gives `per_question` prompts: 2-10 passages, drawn from its
own passages (as many as the draw allows) and other kept requests' passages as distractors, in a
fresh seeded order, so a passage is seen in many orders, neighbours and positions.
"""
from __future__ import annotations

import json
import random


def build(w: dict, held_out: int = 60, per_question: int = 16, val_fraction: float = 0.1,
          min_passages: int = 2, max_passages: int = 10, seed: int = 11) -> dict:
    reqs = w["requests"]
    banned = {p for r in reqs[:held_out] for p in r["passages"]}
    pool = sorted({p for r in reqs[held_out:] for p in r["passages"]} - banned)
    rng = random.Random(seed)
    questions = [i for i in range(held_out, len(reqs))
                 if len([p for p in reqs[i]["passages"] if p not in banned]) >= 1]
    rng.shuffle(questions)
    n_val = max(1, round(len(questions) * val_fraction))
    split = {"validation": sorted(questions[:n_val]), "train": sorted(questions[n_val:])}
    prompts = []
    for part, qs in split.items():
        for q in qs:
            own = [p for p in reqs[q]["passages"] if p not in banned]
            for _ in range(per_question):
                k = rng.randint(min_passages, max_passages)
                mine = rng.sample(own, min(len(own), rng.randint(1, k)))
                others = [p for p in pool if p not in own]
                chosen = mine + rng.sample(others, k - len(mine))
                rng.shuffle(chosen)
                prompts.append({"split": part, "request": q, "passages": chosen,
                                "question_tokens": reqs[q]["question_tokens"]})
    return {"held_out": held_out, "seed": seed, "per_question": per_question,
            "questions": split, "prompts": prompts}


def main():
    import argparse
    ap = argparse.ArgumentParser(description="writes the trainer's prompt set (JSON)")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--held-out", type=int, default=60)
    ap.add_argument("--per-question", type=int, default=16)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    with open(a.workload) as f:
        w = json.load(f)
    s = build(w, a.held_out, a.per_question, seed=a.seed)
    with open(a.out, "w") as f:
        json.dump(s, f)
    n = {k: sum(p["split"] == k for p in s["prompts"]) for k in ("train", "validation")}
    print(f"{n['train']} training and {n['validation']} validation prompts "
          f"({len(s['questions']['train'])} and {len(s['questions']['validation'])} questions)")


if __name__ == "__main__":
    main()
