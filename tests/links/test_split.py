"""The trainer's split and selection: the requests the QA program measures on (the first N) and
every passage they show never reach training; a partial teacher keeps the whole one's order."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "links"))
import distill  # noqa: E402
from links import data  # noqa: E402


def test_held_out_requests_and_their_passages_never_train():
    reqs = [{"passages": [i % 7, (i * 3) % 11, 20 + i], "question_tokens": [1, 2],
             "question": "q", "answer": "a"} for i in range(40)]
    w = data.Workload(prefix=[9], corpus=[[5]] * 60, requests=reqs, end_of_turn=2)
    train, held = data.split(w, held_out=10, orders=2)
    assert [e.request for e in held] == list(range(10))
    seen = {p for e in held for p in e.passages}
    assert train, "nothing left to train on"
    for e in train:
        assert e.request >= 10
        assert not seen & set(e.passages)
        assert len(e.passages) >= 2
    # Two orders of each kept request, shuffled.
    assert len(train) == 2 * len({e.request for e in train})


def test_prompt_set_never_shows_held_out_questions_or_passages():
    """links.corpus (distill.py's prompt sets): no held-out request's question or passage in any
    prompt; no question both trained and validated; 2-10 passages each."""
    import random as _r
    from links import corpus
    rng = _r.Random(3)
    reqs = [{"passages": rng.sample(range(300), 10), "question_tokens": [i]} for i in range(80)]
    s = corpus.build({"requests": reqs}, held_out=20, per_question=4)
    banned = {p for r in reqs[:20] for p in r["passages"]}
    assert s["prompts"]
    for p in s["prompts"]:
        assert p["request"] >= 20
        assert not banned & set(p["passages"])
        assert 2 <= len(p["passages"]) <= 10 and len(set(p["passages"])) == len(p["passages"])
    assert not set(s["questions"]["train"]) & set(s["questions"]["validation"])


def test_a_teacher_over_part_of_the_set_trains_on_the_same_prompts_in_the_same_order():
    """distill.py's selection: a teacher computed only over the prompts a run selects
    (relokv_teacher --only with distill.py --selection) or stopped early gives that run the
    prompts and order the whole teacher would, less the missing ones; the validation prompts are
    the first ones of their split; prompts over the passage limits are never trained on."""
    import random as _r
    rng = _r.Random(5)
    corpus = [{"tokens": [1] * rng.randint(5, 40)} for _ in range(60)]
    prompts = [{"split": "validation" if i % 9 == 0 else "train",
                "passages": rng.sample(range(60), rng.randint(2, 6))} for i in range(300)]
    opts = dict(seed=1, max_train=50, n_val=7, max_passages=5, max_passage_tokens=35)
    train, val = distill.selection(prompts, corpus, lambda i: True, **opts)
    assert len(train) == 50 and len(set(train)) == 50
    assert val == [i for i in range(300) if i % 9 == 0][:7]
    for i in train:
        p = prompts[i]
        assert p["split"] == "train" and len(p["passages"]) <= 5
        assert max(len(corpus[j]["tokens"]) for j in p["passages"]) <= 35
    assert train != sorted(train), "the training order is shuffled"
    chosen = set(train) | set(val)
    assert distill.selection(prompts, corpus, lambda i: i in chosen, **opts) == (train, val)
    early = set(range(150))  # a teacher stopped half way
    t2, v2 = distill.selection(prompts, corpus, lambda i: i in early, **opts)
    full, _ = distill.selection(prompts, corpus, lambda i: True, **{**opts, "max_train": 0})
    assert t2 == [i for i in full if i in early][:50]
    assert v2 == [i for i in val if i in early]


def test_a_teacher_line_that_is_not_one_is_refused_by_file_and_line(tmp_path):
    good = '{"i": 3, "answer": [1, 2], "top_ids": [[1], [2]], "top_logp": [[0.0], [0.0]]}\n'
    p = tmp_path / "t.jsonl"
    p.write_text(good + '{"i": 4, "answer": [1')  # a stop cut the last line short: skipped
    assert list(distill.load_teacher(str(p))) == [3]
    p.write_text(good + '{"answer": [1]}\n')
    with pytest.raises(ValueError, match="t.jsonl:2: not a relokv_teacher line"):
        distill.load_teacher(str(p))
