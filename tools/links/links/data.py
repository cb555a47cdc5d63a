"""Training and evaluation examples from a tokenized workload (relokv_rag --export-workload).

The split: the QA program measures on the first requests of the sample (`--requests N` takes
the first N lines), so the trainer never sees the first `held_out` requests (60 by default) nor
any passage they show; it trains on the others, each request's passages in a fresh seeded order.
"""
from __future__ import annotations

import dataclasses
import json
import random


@dataclasses.dataclass
class Example:
    prefix: list
    passages: list  # corpus indices in the order the prompt shows them
    question: list  # question tokens (the chat template's closing included)
    request: int  # index in the workload


@dataclasses.dataclass
class Workload:
    prefix: list
    corpus: list  # token lists
    requests: list
    end_of_turn: int


def load(path: str) -> Workload:
    with open(path) as f:
        j = json.load(f)
    return Workload(prefix=j["prefix"], corpus=[c["tokens"] for c in j["corpus"]],
                    requests=j["requests"], end_of_turn=j["end_of_turn"])


def split(w: Workload, held_out: int = 60, seed: int = 7, orders: int = 1,
          max_train: int | None = None):
    """(train, held) examples. held: the first `held_out` requests in the workload's own order
    (the measurements' prompts); train: the others, each in `orders` seeded orders, with the
    held-out requests' passages removed from their prompts."""
    held = [Example(w.prefix, list(r["passages"]), r["question_tokens"], i)
            for i, r in enumerate(w.requests[:held_out])]
    seen = {p for e in held for p in e.passages}
    rng = random.Random(seed)
    train = []
    for i, r in enumerate(w.requests[held_out:], start=held_out):
        ps = [p for p in r["passages"] if p not in seen]
        if len(ps) < 2:
            continue
        for _ in range(orders):
            order = ps[:]
            rng.shuffle(order)
            train.append(Example(w.prefix, order, r["question_tokens"], i))
    rng.shuffle(train)
    if max_train is not None:
        train = train[:max_train]
    return train, held
