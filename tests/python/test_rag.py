"""relokv.rag.run: the QA job's figures as Python objects, the same as relokv_rag prints."""

import json
import os
import subprocess

import pytest

import relokv
from conftest import need

DETERMINISTIC = ["computed", "work_pct", "exact_pct", "relocated_pct", "identical_pct"]
ESTIMATES = {"first_token_kl": "first_token_kl", "agreement_pct": "agreement_pct", "f1_pct": "f1_pct",
             "answer_kl": "answer_kl"}
JSON_NAMES = {"computed": "tokens_computed", "exact_pct": "exact_hit_pct", "relocated_pct": "relocated_hit_pct"}


def relokv_rag(tmp_path, *args):
    exe = os.environ.get("RELOKV_RAG_BIN")
    need("relokv_rag (run through ctest)", exe and os.path.exists(exe))
    out = tmp_path / "rag.json"
    r = subprocess.run([exe, "--quiet", "--json", str(out), *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())["variants"]


def compare(result, want):
    assert [v.key for v in result.variants] == [w["key"] for w in want]
    for v, w in zip(result.variants, want):
        for f in DETERMINISTIC:
            assert getattr(v, f) == pytest.approx(w[JSON_NAMES.get(f, f)], rel=1e-9, abs=1e-12), (v.key, f)
        for f, jf in ESTIMATES.items():
            got = getattr(v, f)
            assert (got.mean, got.lo, got.hi) == pytest.approx(
                (w[jf]["mean"], w[jf]["lo"], w[jf]["hi"]), rel=1e-9, abs=1e-12), (v.key, f)


def test_synthetic_run_equals_relokv_rag(tmp_path):
    progress = []
    r = relokv.rag.run(model=None, variants=["naive", "epic"], requests=2, passages=3, corpus=6,
                       progress=lambda done, total: progress.append((done, total)))
    assert r.synthetic and r.source == "generator"
    # full recompute first; the bf16 KV's own rounding (full with fp32 KV) last, as relokv_rag.
    assert [v.key for v in r.variants] == ["full", "naive", "epic", "fp32_floor"]
    assert r["full"].work_pct == pytest.approx(100.0)
    assert r["naive"].work_pct < r["epic"].work_pct < 100.0
    assert len(r["epic"].requests["first_token_kl"]) == 2
    assert progress and progress[-1][0] == progress[-1][1]
    compare(r, relokv_rag(tmp_path, "--synthetic", "--requests", "2", "--passages", "3", "--corpus", "6",
                          "--variants", "naive,epic"))


def test_two_rows_of_the_demo(tmp_path, smollm2):
    # The demo's table (scripts/demo: relokv_rag on SmolLM2 and the shipped sample), two rows.
    r = relokv.rag.run(model="smollm2", variants=["epic"], requests=2)
    assert r.source.endswith("2wikimqa_dev_sample200.jsonl") and not r.synthetic
    compare(r, relokv_rag(tmp_path, "--model", smollm2, "--requests", "2", "--variants", "epic"))


def test_pandas_frames():
    pd = pytest.importorskip("pandas")
    r = relokv.rag.run(model=None, variants=["naive"], requests=2, passages=3, corpus=6)
    df = r.to_pandas()
    assert list(df.index) == ["full", "naive", "fp32_floor"] and "first_token_kl_lo" in df.columns
    q = r.requests_frame()
    assert len(q) == 6 and set(q["variant"]) == {"full", "naive", "fp32_floor"}
    assert isinstance(pd.DataFrame, type)


def test_bad_options_raise():
    with pytest.raises(relokv.Error, match="unknown variant 'sideways'"):
        relokv.rag.run(model=None, variants=["sideways"], requests=1)
    with pytest.raises(relokv.Error, match="requests"):
        relokv.rag.run(model=None, requests=0)
    with pytest.raises(relokv.Error, match="placement"):
        relokv.rag.run(model=None, requests=1, placement="x")
    with pytest.raises(relokv.Error, match="topk"):
        relokv.rag.run(model=None, requests=1, topk=0)
    with pytest.raises(relokv.ModelError):
        relokv.rag.run(model="/nonexistent/model.gguf", requests=1)
    with pytest.raises(Exception, match="no-such-file"):
        relokv.rag.run(model=None, data="/no-such-file.jsonl", requests=1)
