"""Span links on SmolLM2-135M: the engine with links equals the trainer's forward on the same
rows, and the shipped adapter beats untrained rows on held-out questions.

Tolerances (stated in docs/strategies.md "Links"): the first answer token's log-probabilities,
engine against trainer, differ by at most 0.1 with an fp32 KV pool and 0.25 with bf16 (the
engine's default), their KL is at most 1e-4 and 1e-3 nats, and the argmax is the same. The
trainer is fp32 with the spans' K/V rounded to bf16 as the pool holds them; the engine
quantizes activations for its integer products, which the bound covers."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "links"))
import jax.numpy as jnp  # noqa: E402
from links import adapter, data, pic  # noqa: E402
from links import model as M  # noqa: E402
import train  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ADAPTER = os.path.join(ROOT, "tools", "links", "adapters", "smollm2-135m.gguf")
MODEL = os.path.join(os.environ.get("RELOKV_MODEL_DIR", os.path.expanduser("~/.cache/relokv")),
                     "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not os.path.exists(MODEL):
        pytest.skip("no SmolLM2 model (scripts/get-model smollm2)")
    wl = str(tmp_path_factory.mktemp("links") / "wl.json")
    subprocess.run([os.environ["RELOKV_RAG_BIN"], "--model", MODEL, "--requests", "8",
                    "--export-workload", wl], check=True, capture_output=True)
    m = M.load(MODEL)
    return m, pic.Runner(m), data.load(wl), wl


def first_logp(e):
    a = np.asarray(e, np.float64)
    a -= a.max()
    return a - np.log(np.exp(a).sum())


@pytest.mark.parametrize("kv,tol,kl_tol", [("fp32", 0.1, 1e-4), ("bf16", 0.25, 1e-3)])
def test_engine_with_links_equals_the_trainer(setup, kv, tol, kl_tol):
    m, runner, w, wl = setup
    rows, meta = adapter.read(ADAPTER)
    k = rows.shape[0]
    for i in (0, 1):
        req = w.requests[i]
        out = subprocess.run([os.environ["RELOKV_LINKS_PROBE"], "--model", MODEL, "--links",
                              ADAPTER, "--workload", wl, "--request", str(i), "--kv-dtype", kv],
                             check=True, capture_output=True, text=True)
        got = json.loads(out.stdout)
        assert got["relocated_blocks"] > 0
        ctx = runner.relocated(w.prefix, [(p, w.corpus[p]) for p in req["passages"]])
        q = req["question_tokens"]
        x, pos, valid, _ = pic.student_inputs(runner, k, ctx, q, [0])
        want = np.asarray(pic.student_logp(m.cfg, k, m.params, jnp.asarray(rows), x, pos, valid,
                                           *ctx.padded()))[len(q) - 1]
        eng = first_logp(got["links"])
        kl = float(np.sum(np.exp(want) * (want - eng)))
        assert np.abs(eng - want).max() <= tol, (i, np.abs(eng - want).max())
        assert kl <= kl_tol, (i, kl)
        assert int(np.argmax(eng)) == int(np.argmax(want))


def test_adapter_records_its_model_and_command():
    rows, meta = adapter.read(ADAPTER)
    assert meta["relokv.links.model_arch"] == "llama"
    assert meta["relokv.links.model_dim"] == rows.shape[1] == 576
    with open(MODEL, "rb") as f:
        assert meta["relokv.links.model_sha256"] == hashlib.sha256(f.read()).hexdigest()
    info = json.loads(meta["relokv.links.info"])
    assert info["command"].startswith("python3 tools/links/train.py")
    assert info["held_out"] >= 60


def test_trained_rows_beat_untrained_ones_held_out(setup):
    """Six held-out requests (never trained on): the shipped rows' mean KL over the answer must
    be at most 0.9x that of untrained rows (token embeddings, the trainer's initialization),
    and below naive reuse's (no rows at all)."""
    m, runner, w, _ = setup
    rows, _ = adapter.read(ADAPTER)
    _, held = data.split(w, held_out=60)
    items = train.teacher_set(runner, w, held[:6], 16, None)
    trained = train.evaluate(runner, items, rows)
    untrained = train.evaluate(runner, items, train.init_links(m, rows.shape[0], 1))
    naive = train.evaluate(runner, items, None)
    print(json.dumps({"trained": trained, "untrained": untrained, "naive": naive}))
    assert trained["answer_kl"] <= 0.9 * untrained["answer_kl"]
    assert trained["answer_kl"] < naive["answer_kl"]


def test_teacher_answers_the_prompts_asked_and_resumes_by_index(setup, tmp_path):
    """relokv_teacher --only: the listed prompts (in index order), a line cut short by a stop is
    computed again, a complete line is kept as written, and the answers are the whole run's; a
    prompt index out of the set and a cache line without its index are refused by name."""
    _, _, w, wl = setup
    reqs = w.requests[:3]
    ps = {"prompts": [{"passages": list(r["passages"][:2]),
                       "question_tokens": list(r["question_tokens"]),
                       "split": "train"} for r in reqs]}
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(ps))

    def run(out, only=None):
        cmd = [os.environ["RELOKV_TEACHER_BIN"], "--model", MODEL, "--workload", wl,
               "--prompts", str(prompts), "--out", str(out), "--answer", "4", "--top", "4"]
        if only is not None:
            (tmp_path / "only.json").write_text(json.dumps(only))
            cmd += ["--only", str(tmp_path / "only.json")]
        return subprocess.run(cmd, capture_output=True, text=True)

    def lines(out):
        return [json.loads(s) for s in out.read_text().splitlines()]

    part = tmp_path / "part.jsonl"
    assert run(part, [2, 0]).returncode == 0
    assert [x["i"] for x in lines(part)] == [0, 2]
    first = lines(part)[0]
    first["answer"] = [7, 7, 7, 7]  # a line kept as written is not computed again
    text = part.read_text().splitlines()
    part.write_text(json.dumps(first) + "\n" + text[1][: len(text[1]) // 2])
    assert run(part, [0, 1, 2]).returncode == 0
    got = lines(part)
    assert [x["i"] for x in got] == [0, 1, 2]
    assert got[0]["answer"] == [7, 7, 7, 7]
    whole = tmp_path / "whole.jsonl"
    assert run(whole).returncode == 0
    assert [x["answer"] for x in lines(whole)][1:] == [x["answer"] for x in got][1:]
    bad = run(tmp_path / "bad.jsonl", [1, 3])
    assert bad.returncode != 0 and "3 is not a prompt index" in bad.stderr, bad.stderr
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text(part.read_text() + '{"answer": [1]}\n')
    bad = run(corrupt, [0])
    assert bad.returncode != 0 and "corrupt.jsonl:4: not a teacher line" in bad.stderr, bad.stderr
