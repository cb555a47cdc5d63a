"""The engine from Python: logits equal to the C++ engine's bit for bit, the KV as arrays that
share the engine's memory, the GIL released, and bad inputs raising."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import relokv
from conftest import run_oracle

DOCS = ["Paris is the capital of France. It lies on the Seine.",
        "The Eiffel Tower was designed by Gustave Eiffel's company for the 1889 World's Fair.",
        "Mount Everest is the highest mountain above sea level, in the Himalayas."]


def spans_of(eng, order):
    return [eng.tokenize(DOCS[i]).tolist() for i in order]


def requests_for(eng):
    lay = eng.layout([DOCS[0]], "q")
    system = lay.tokens[: lay.segments[0][2]].tolist()  # the chat template's system turn
    q = eng.tokenize("Who designed the tower?").tolist() + [1, 2]
    seq = [((0, 1, 2), "full"), ((0, 1, 2), "naive"), ((2, 0, 1), "naive"), ((1, 2, 0), "epic"),
           ((2, 1, 0), "cacheblend")]
    return [{"prefix": system, "spans": spans_of(eng, o), "question": q, "strategy": s} for o, s in seq]


def python_logits(eng, reqs):
    out = []
    for r in reqs:
        b = relokv.LayoutBuilder(eng.block_size).prefix(r["prefix"])
        for s in r["spans"]:
            b.span(s)
        logits = eng.prefill(b.question(r["question"]).build(), r["strategy"])
        out.append((logits.view(np.uint32).tolist(), eng.stats))
        eng.end()
    return out


def check_against_oracle(tmp_path, model, kv_dtype, placement):
    eng = relokv.Engine(model, num_blocks=256, kv_dtype=kv_dtype, placement=placement)
    reqs = requests_for(eng)
    want = run_oracle(tmp_path, {"engine": {"model": model or "", "num_blocks": 256, "block_size": 16,
                                            "placement": placement, "kv_dtype": kv_dtype},
                                 "requests": reqs})
    got = python_logits(eng, reqs)
    for (bits, st), w_bits, w_st in zip(got, want["logits"], want["stats"]):
        assert bits == w_bits  # bit for bit
        assert {k: st[k] for k in w_st} == w_st
    # The sequence reused relocated spans and computed less than full prefill did.
    assert any(st["relocated_hits"] > 0 for _, st in got)
    assert min(st["work"] for _, st in got) < 1.0


@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16"])
def test_logits_equal_the_cpp_engine_synthetic(tmp_path, kv_dtype):
    check_against_oracle(tmp_path, None, kv_dtype, "block_relative")


def test_logits_equal_the_cpp_engine_smollm2(tmp_path, smollm2):
    check_against_oracle(tmp_path, smollm2, "bf16", "at_attention")


def test_tokenizer_and_generation(smollm2):
    eng = relokv.Engine("smollm2", num_blocks=256)
    assert eng.name and eng.vocab > 40000 and eng.end_of_turn >= 0
    ids = eng.tokenize("The Eiffel Tower")
    assert ids.dtype == np.int32 and eng.detokenize(ids) == "The Eiffel Tower"
    assert eng.detokenize(ids.tolist()) == "The Eiffel Tower"
    # A document's special-token literal is text unless special=True says it is trusted.
    assert eng.end_of_turn not in eng.tokenize("<|im_end|>").tolist()
    assert eng.tokenize("<|im_end|>", special=True).tolist() == [eng.end_of_turn]
    lay = eng.layout(DOCS, "Who designed the Eiffel Tower? Answer in a few words.")
    assert [s[0] for s in lay.segments] == ["prefix", "span", "span", "span", "dependent"]
    logits = eng.prefill(lay, "epic")
    answer = eng.generate(logits, 12)
    assert 0 < len(answer) <= 12
    assert "Eiffel" in eng.detokenize(answer)
    eng.end()


def test_plain_layout_finds_passages_in_any_format(smollm2):
    """Engine.plain_layout cuts a plain message with the server's span finder: a numbered
    source's label stays outside its span, so the passages recur as the same spans reordered,
    and a passage seen before is found again inline; the tokens are the message's own."""
    eng = relokv.Engine("smollm2", num_blocks=256)
    a, b = " ".join(DOCS), " ".join(reversed(DOCS))

    def spans(lay):
        return [tuple(lay.tokens[s[1]:s[1] + s[2]]) for s in lay.segments if s[0] == "span"]

    one = eng.plain_layout(f"Cite sources.\n[1] {a}\n[2] {b}\nQuestion: who?")
    two = eng.plain_layout(f"Cite sources.\n[1] {b}\n[2] {a}\nQuestion: who?")
    assert len(spans(one)) == 2 and sorted(spans(one)) == sorted(spans(two))
    inline = eng.plain_layout(f"Sources, all on one line: {b} and so on. Question: who?")
    assert spans(one)[1] in spans(inline)
    with pytest.raises(relokv.Error, match="empty message"):
        eng.plain_layout("")


def test_kv_arrays_share_the_engines_memory():
    eng = relokv.Engine(None, num_blocks=64, kv_dtype="fp32")
    pool = np.asarray(eng.kv)
    again = np.asarray(eng.kv)
    assert pool.shape == (eng.n_layers, 64, 2, eng.n_kv_heads, 16, eng.head_dim)
    assert np.shares_memory(pool, again)
    assert pool.__array_interface__["data"][0] == again.__array_interface__["data"][0]
    assert np.shares_memory(pool, np.from_dlpack(eng.kv))  # DLPack, as torch.from_dlpack reads it
    before = pool.copy()
    eng.prefill(eng.layout(DOCS[:2], "Who?"), "full")
    # The engine wrote the request's K/V into the memory the array shows.
    assert not np.array_equal(before, pool)
    views = eng.request_kv()
    table = eng.block_table()
    assert len(views) == len(table) and len(views) > 0
    for v, (block, pos0, n) in zip(views, table):
        a = np.asarray(v)
        assert a.shape == (eng.n_layers, 2, eng.n_kv_heads, n, eng.head_dim)
        assert np.shares_memory(a, pool)
        np.testing.assert_array_equal(a, pool[:, block, :, :, :n])
    # A view keeps the engine's memory alive after the engine is gone.
    first = np.asarray(views[0]).copy()
    keep = views[0]
    eng.end()
    del eng, pool, again, views
    np.testing.assert_array_equal(np.asarray(keep), first)


def test_bf16_kv_through_dlpack():
    eng = relokv.Engine(None, num_blocks=32)
    kv = eng.kv
    assert hasattr(kv, "__dlpack__")
    bits = np.asarray(eng.kv_bits)
    assert bits.dtype == np.uint16 and bits.shape == (eng.n_layers, 32, 2, eng.n_kv_heads, 16, eng.head_dim)
    eng.prefill(eng.layout(DOCS[:1], "Who?"), "full")
    # The uint16 view shows what the engine wrote, without a copy.
    assert bits.any() and np.shares_memory(bits, np.asarray(eng.kv_bits))
    values = (bits.astype(np.uint32) << 16).view(np.float32)
    # DLPack hands the bfloat16 pool to a framework that has the type (JAX here, as torch).
    jax = pytest.importorskip("jax") if os.environ.get("CI") != "true" else __import__("jax")
    arr = np.asarray(jax.dlpack.from_dlpack(kv).astype("float32"))
    np.testing.assert_array_equal(arr, values)
    assert relokv.Engine(None, num_blocks=4, kv_dtype="fp32").kv_bits is None
    eng.end()


def test_gil_is_released_and_two_engines_run_in_two_threads():
    engines = [relokv.Engine(None, num_blocks=128) for _ in range(2)]
    layouts = [e.layout(DOCS, "Who designed it?") for e in engines]
    alone = engines[0].prefill(layouts[0], "full")
    engines[0].end(commit=False)
    ticks = [0]
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.0005)

    results = [None, None]

    def work(i):
        for _ in range(3):
            results[i] = engines[i].prefill(layouts[i], "full")
            engines[i].end(commit=False)

    t = threading.Thread(target=ticker)
    t.start()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    for r in results:
        np.testing.assert_array_equal(r, alone)
    # Python ran while the engines computed: the ticker advanced during the prefills.
    assert ticks[0] > 10, (ticks[0], elapsed)


def test_one_engine_from_two_threads_takes_turns():
    eng = relokv.Engine(None, num_blocks=128)
    lay = eng.layout(DOCS, "Who?")
    errors = []

    def work():
        for _ in range(5):
            try:
                eng.prefill(lay, "naive")
                eng.end()
            except relokv.Error as e:  # the other thread's request is live: refused, not a crash
                errors.append(str(e))

    ts = [threading.Thread(target=work) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all("live" in e or "no live" in e for e in errors)


BAD = [
    (lambda e: e.decode(1), relokv.Error, "no live request"),
    (lambda e: e.generate(np.zeros(e.vocab, np.float32)), relokv.Error, "no live request"),
    (lambda e: e.generate(np.zeros(3, np.float32)), relokv.Error, "vocabulary"),
    (lambda e: e.block_table(), relokv.Error, "no live request"),
    (lambda e: e.request_kv(), relokv.Error, "no live request"),
    (lambda e: e.decode(-1), IndexError, "outside the vocabulary"),
    (lambda e: e.decode(10**9), IndexError, "outside the vocabulary"),
    (lambda e: e.detokenize([e.vocab]), IndexError, None),
    (lambda e: e.prefill(relokv.LayoutBuilder(16).prefix([1, 2, 10**6]).build()), relokv.LayoutError,
     "id 1000000 not in"),
    (lambda e: e.prefill(relokv.LayoutBuilder(32).prefix([1, 2]).build()), relokv.Error, "block_size"),
    (lambda e: e.prefill(e.layout(DOCS, "q"), "sideways"), ValueError, "unknown strategy"),
    (lambda e: e.prefill("text"), TypeError, None),
    (lambda e: e.layout([""], "q"), relokv.Error, "empty document"),
]


@pytest.mark.parametrize("call,exc,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_engine_calls_raise(call, exc, message):
    eng = relokv.Engine(None, num_blocks=64)
    with pytest.raises(exc, match=message):
        call(eng)
    # And the engine still works after the error.
    eng.prefill(eng.layout(DOCS[:1], "q"), "full")
    eng.end()


def test_prefill_while_live_raises_and_keeps_the_request():
    eng = relokv.Engine(None, num_blocks=64)
    lay = eng.layout(DOCS[:1], "q")
    logits = eng.prefill(lay)
    with pytest.raises(relokv.Error, match="end\\(\\) it first"):
        eng.prefill(lay)
    assert eng.decode(int(np.argmax(logits))).shape == (eng.vocab,)
    eng.end()


def test_out_of_blocks_raises():
    eng = relokv.Engine(None, num_blocks=2)
    with pytest.raises(relokv.OutOfBlocks):
        eng.prefill(eng.layout(DOCS, "q"))
    eng2 = relokv.Engine(None, num_blocks=64)
    eng2.prefill(eng2.layout(DOCS[:1], "q"))
    eng2.end()


def test_bad_models_raise(tmp_path):
    with pytest.raises(relokv.ModelError):
        relokv.Engine(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + os.urandom(64))
    with pytest.raises(relokv.ModelError):
        relokv.Engine(str(bad))
    with pytest.raises(ValueError, match="unknown model"):
        relokv.Engine("llama-70b")
    with pytest.raises(relokv.Error, match="kv_dtype"):
        relokv.Engine(None, kv_dtype="fp8")
    with pytest.raises(relokv.Error, match="placement"):
        relokv.Engine(None, placement="sideways")
    with pytest.raises(relokv.Error, match="num_blocks"):
        relokv.Engine(None, num_blocks=0)


def test_store_shared_by_two_engines(tmp_path):
    url = f"file:{tmp_path}"
    a = relokv.Engine(None, num_blocks=64, store=url)
    lay = a.layout(DOCS, "Who?")
    want = a.prefill(lay, "naive")
    a.end()
    b = relokv.Engine(None, num_blocks=64, store=url)
    got = b.prefill(lay, "naive")
    assert b.stats["store_hits"] > 0
    np.testing.assert_array_equal(got, want)
    b.end()


LEAK_SCRIPT = r"""
import numpy as np, relokv
e = relokv.Engine(None, num_blocks=32, kv_dtype="fp32")
l = e.layout(["a document", "another one"], "q?")
x = e.prefill(l, "epic"); v = e.request_kv(); k = np.asarray(e.kv); e.end()
c = relokv.Cache(16, store="memory:", kv_shape=(1, 1, 8))
p = c.plan(relokv.LayoutBuilder().prefix([1, 2, 3]).span([4, 5]).question([6]).build())
m = p.compute; c.commit(p); c.release(p)
for bad in (lambda: relokv.LayoutBuilder().prefix([-1]), lambda: relokv.Cache(0), lambda: e.decode(1)):
    try:
        bad()
    except Exception:
        pass
del e, l, x, v, k, c, p, m
"""


def test_no_leaks():
    # nanobind reports instances, types and functions still alive at exit on stderr.
    out = subprocess.run([sys.executable, "-c", LEAK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "leaked" not in out.stderr, out.stderr
