"""Every adapter kind on SmolLM2-135M: relokv's engine serving an adapter (deep rows before the
question, deep and shallow per-span wrappers, the deep low-rank correction of span K/V) gives
the first answer token the log-probs the trainer's student (tools/links/links/student.py)
computes for the same rows, within the tolerances docs/strategies.md "Links" states (the same as
the shallow rows': 0.1 with an fp32 pool, 0.25 with bf16; KL 1e-4 and 1e-3; the same argmax).
The adapters are untrained (the trainer's own initialization: real tokens' K/V for deep rows,
token embeddings for shallow ones), written and read through the adapter file; a correction is
given a random b large enough to move the answer (it starts at zero)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "links"))
from links import adapter, pic, student  # noqa: E402
from links import model as M  # noqa: E402
import distill  # noqa: E402

MODEL = os.path.join(os.environ.get("RELOKV_MODEL_DIR", os.path.expanduser("~/.cache/relokv")),
                     "SmolLM2-135M-Instruct.Q4_1.gguf")
KINDS = [student.Shape("kv", 0, 0, 16), student.Shape("kv", 4, 4, 0),
         student.Shape("embedding", 4, 4, 8), student.Shape("kv", 0, 4, 8),
         student.Shape("kv", 0, 0, 8, 4, 8), student.Shape("kv", 0, 0, 0, 4, 8)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not os.path.exists(MODEL):
        pytest.skip("no SmolLM2 model (scripts/get-model smollm2)")
    d = tmp_path_factory.mktemp("kinds")
    wl = str(d / "wl.json")
    subprocess.run([os.environ["RELOKV_RAG_BIN"], "--model", MODEL, "--requests", "4",
                    "--export-workload", wl], check=True, capture_output=True)
    m = M.load(MODEL)
    with open(wl) as f:
        return m, pic.Runner(m), json.load(f), wl, d


def kind_id(s):
    return (f"{s.depth}-h{s.header}-t{s.trailer}-q{s.before_question}"
            + (f"-lowrank{s.lowrank}x{s.lowrank_layers}" if s.lowrank else ""))


@pytest.mark.parametrize("shape", KINDS, ids=kind_id)
def test_engine_serves_every_adapter_kind_as_the_trainer_computes_it(setup, shape):
    m, runner, w, wl, d = setup
    ex = distill.Examples(m, runner, w, shape)
    theta = student.init(m, shape, [c["tokens"] for c in w["corpus"]], ex.pre[:2], seed=5)
    if shape.lowrank:  # b at zero corrects nothing: a random one of the K/V's own scale
        lo = shape.first_corrected(m.cfg.n_layers)
        sd = np.array([np.std(ex.pre[0][lo:]), np.std(ex.pre[1][lo:])]).reshape(1, 1, 2, 1, 1)
        rng = np.random.default_rng(7)
        theta["lowrank_b"] = rng.normal(0, 1, theta["lowrank_b"].shape) * sd * 0.5
    rows, kv = student.to_file(shape, theta, m)
    path = str(d / f"{shape.depth}-{shape.header}-{shape.trailer}-{shape.before_question}-"
                   f"{shape.lowrank}.gguf")
    adapter.write(path, rows, m, "", placement=shape.placement, header=shape.header,
                  trailer=shape.trailer, kv=kv, lowrank=student.lowrank_to_file(shape, theta, m),
                  depth=shape.depth)
    back_shape, back = student.from_file(*adapter.read(path), m)
    assert back_shape == shape
    req = w["requests"][2]
    prompt = {"passages": req["passages"], "question_tokens": req["question_tokens"]}
    dummy = (np.zeros(1, np.int32), np.zeros((1, 4), np.int32), np.zeros((1, 4), np.float32))
    it = ex.build(prompt, dummy)
    want = np.asarray(student.student_logp(m.cfg, shape, m.params, back, ex.pre, it["flat"],
                                           it["spans"], it["at"], it["x"], it["n_new"]))
    want = want[len(req["question_tokens"]) - 1]
    if shape.lowrank:  # the correction moves the answer by more than the tolerances below
        plain = student.Shape(shape.depth, shape.header, shape.trailer, shape.before_question)
        ex0 = distill.Examples(m, runner, w, plain)
        it0 = ex0.build(prompt, dummy)
        th0 = {k: back[k] for k in back if not k.startswith("lowrank")}
        base = np.asarray(student.student_logp(m.cfg, plain, m.params, th0, ex0.pre,
                                               it0["flat"], it0["spans"], it0["at"], it0["x"],
                                               it0["n_new"]))[len(req["question_tokens"]) - 1]
        assert np.abs(base - want).max() > 1.0, np.abs(base - want).max()
    for kv_dtype, tol, kl_tol in (("fp32", 0.1, 1e-4), ("bf16", 0.25, 1e-3)):
        out = subprocess.run([os.environ["RELOKV_LINKS_PROBE"], "--model", MODEL, "--links",
                              path, "--workload", wl, "--request", "2", "--kv-dtype", kv_dtype],
                             check=True, capture_output=True, text=True)
        got = json.loads(out.stdout)
        assert got["relocated_blocks"] > 0
        e = np.asarray(got["links"], np.float64)
        e -= e.max()
        e -= np.log(np.exp(e).sum())
        kl = float(np.sum(np.exp(want) * (want - e)))
        assert np.abs(e - want).max() <= tol, (kv_dtype, np.abs(e - want).max())
        assert kl <= kl_tol, (kv_dtype, kl)
        assert int(np.argmax(e)) == int(np.argmax(want))


ADAPTERS = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "links", "adapters")
MODELS = os.path.dirname(MODEL)
# The shipped learned adapters and their models.
LEARNED = [("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-learned.gguf"),
           ("gemma-3-270m-q4_k_m.gguf", "gemma3-270m-learned.gguf"),
           ("Qwen2.5-Coder-0.5B-Instruct.gguf", "qwen2.5-0.5b-learned.gguf")]


def first_kl(wl, path, request, model=MODEL):
    """KL(full || served with the adapter) of the first answer token, as relokv's engine
    serves the request (relokv_links_probe, KV bf16)."""
    out = subprocess.run([os.environ["RELOKV_LINKS_PROBE"], "--model", model, "--links", path,
                          "--workload", wl, "--request", str(request)],
                         check=True, capture_output=True, text=True)
    got = json.loads(out.stdout)

    def logp(z):
        z = np.asarray(z, np.float64)
        z = z - z.max()
        return z - np.log(np.exp(z).sum())

    f, s = logp(got["full"]), logp(got["links"])
    return float(np.sum(np.exp(f) * (f - s)))


@pytest.mark.parametrize("model_file,adapter_file", LEARNED, ids=[a for _, a in LEARNED])
def test_learned_adapter_beats_its_initialization_held_out(model_file, adapter_file, tmp_path):
    """Each shipped learned adapter against the same kind untrained (the trainer's own
    initialization, seed 1), on six held-out requests (the sample's first, never trained or
    validated on), measured in relokv's engine: the mean first-token KL with full recompute
    must be at most 0.8x the untrained one's."""
    model = os.path.join(MODELS, model_file)
    learned = os.path.join(ADAPTERS, adapter_file)
    if not os.path.exists(model):
        pytest.skip(f"no {model_file} (scripts/get-model)")
    m = M.load(model)
    runner = pic.Runner(m)
    wl6 = str(tmp_path / "wl6.json")
    subprocess.run([os.environ["RELOKV_RAG_BIN"], "--model", model, "--requests", "6",
                    "--export-workload", wl6], check=True, capture_output=True)
    with open(wl6) as f:
        w = json.load(f)
    data, meta = adapter.read(learned)
    shape, _ = student.from_file(data, meta, m)
    ex = distill.Examples(m, runner, w, shape)
    theta = student.init(m, shape, [c["tokens"] for c in w["corpus"]], ex.pre[:2], seed=1)
    rows, kv = student.to_file(shape, theta, m)
    init = str(tmp_path / "init.gguf")
    adapter.write(init, rows, m, "", placement=shape.placement, header=shape.header,
                  trailer=shape.trailer, kv=kv)
    trained = np.mean([first_kl(wl6, learned, i, model) for i in range(6)])
    untrained = np.mean([first_kl(wl6, init, i, model) for i in range(6)])
    print(json.dumps({"adapter": adapter_file, "trained": trained, "untrained": untrained}))
    assert trained <= 0.8 * untrained, (trained, untrained)


def test_a_run_starts_from_an_adapter_of_its_own_model_and_shape_only(setup):
    """distill.py --init: the parameters come back as the adapter holds them (a correction's
    too); an adapter of another shape or trained for another model file is refused by name."""
    m, runner, w, wl, d = setup
    shape = student.Shape("kv", 0, 0, 8, 4, 8)
    ex = distill.Examples(m, runner, w, shape)
    corpus = [c["tokens"] for c in w["corpus"]]
    theta = student.init(m, shape, corpus, ex.pre[:2], seed=5)
    theta["lowrank_b"] = np.random.default_rng(3).normal(0, 1, theta["lowrank_b"].shape)
    with open(MODEL, "rb") as f:
        sha = __import__("hashlib").sha256(f.read()).hexdigest()
    rows, kv = student.to_file(shape, theta, m)
    path, other = str(d / "init.gguf"), str(d / "init-other-model.gguf")
    for p, s in ((path, sha), (other, "0" * 64)):
        adapter.write(p, rows, m, s, placement=shape.placement, kv=kv,
                      lowrank=student.lowrank_to_file(shape, theta, m), depth=shape.depth)
    fresh = student.init(m, shape, corpus, ex.pre[:2], seed=6)
    back = distill.warm_start(path, sha, m, shape, fresh)
    assert sorted(back) == sorted(theta)
    for k in theta:
        np.testing.assert_allclose(np.asarray(back[k]), np.asarray(theta[k]), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="another model"):
        distill.warm_start(other, sha, m, shape, fresh)
    wider = student.Shape("kv", 0, 0, 16, 4, 8)
    with pytest.raises(ValueError, match="shape"):
        distill.warm_start(path, sha, m, wider,
                           student.init(m, wider, corpus, ex.pre[:2], seed=6))
