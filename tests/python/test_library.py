"""The library from Python: layouts, strategies, the cache's plans (equal to C++'s), stores,
provenance, and every bad input raising a Python exception with the C++ message."""

import os

import numpy as np
import pytest

import relokv
from conftest import run_oracle

BS = 16
SYSTEM = list(range(1, 24))
DOCS = [list(range(100, 140)), list(range(200, 233)), list(range(300, 350)), list(range(400, 417))]
QUESTION = [7, 8, 9, 10, 11]


def layout(order, question=QUESTION, block_size=BS):
    b = relokv.LayoutBuilder(block_size).prefix(SYSTEM)
    for i in order:
        b.span(DOCS[i])
    return b.question(question).build()


REQUESTS = [((0, 1, 2), "naive"), ((2, 0, 1), "epic"), ((1, 3, 0), "kvboost"), ((0, 1, 2), "cacheblend"),
            ((3, 2, 1, 0), "seam"), ((2, 0, 1), "naive")]


def test_layout_segments_and_blocks():
    l = layout((0, 1))
    assert l.num_tokens == len(SYSTEM) + 40 + 33 + len(QUESTION)
    assert [s[0] for s in l.segments] == ["prefix", "span", "span", "dependent"]
    assert l.segments[1][1:3] == (23, 40)
    assert l.block_size == BS and len(l) == l.num_tokens
    # Every segment starts a block; tokens come back in order.
    assert l.blocks[0][:2] == (0, 16) and l.blocks[1][:2] == (16, 7)
    assert list(l.tokens[:3]) == [1, 2, 3] and l.tokens.dtype == np.int32
    assert l == layout((0, 1)) and not (l == layout((1, 0)))
    # Arrays of any integer type and lists give the same layout.
    a = relokv.LayoutBuilder(BS).prefix(np.array(SYSTEM, dtype=np.int64)).span(np.array(DOCS[0], np.uint16))
    b = relokv.LayoutBuilder(BS).prefix(SYSTEM).span(DOCS[0])
    assert a.question(QUESTION).build() == b.question(QUESTION).build()


@pytest.mark.parametrize("placement", ["at_attention", "block_relative", "pre_rotated"])
def test_plans_equal_the_cpp_plans(tmp_path, placement):
    spec = {"cache": {"num_blocks": 64, "block_size": BS, "placement": placement},
            "requests": [{"prefix": SYSTEM, "spans": [DOCS[i] for i in order], "question": QUESTION,
                          "strategy": s} for order, s in REQUESTS]}
    want = run_oracle(tmp_path, spec)["plans"]
    cache = relokv.Cache(64, BS, placement=placement)
    got = []
    for order, s in REQUESTS:
        p = cache.plan(layout(order), s)
        got.append({"ok": p.ok, "id": p.id, "exact_hits": p.exact_hits, "relocated_hits": p.relocated_hits,
                    "misses": p.misses, "tokens_to_compute": p.tokens_to_compute,
                    "compute": p.compute.tolist(), "blocks": p.blocks})
        cache.commit(p)
        cache.release(p)
    assert got == want
    # The sequence reused something, relocated included, and recomputed some of it.
    assert sum(p["relocated_hits"] for p in got) > 0 and sum(p["exact_hits"] for p in got) > 0
    assert cache.stats["requests"] == len(REQUESTS)


def test_plan_views_and_lifecycle():
    cache = relokv.Cache(64, BS)
    p = cache.plan(layout((0, 1)))
    assert p.ok and p.misses == p.compute.size // BS + 2 or p.misses > 0
    assert p.compute.dtype == np.uint8 and p.compute.sum() == p.tokens_to_compute
    assert p.recompute_rows.tolist() == np.flatnonzero(p.compute).tolist()
    assert len(p.block_table) == len(p.blocks) and cache.live_requests == 1
    cache.commit(p)
    cache.release(p)
    assert cache.live_requests == 0 and cache.cached_blocks > 0
    q = cache.plan(layout((1, 0)), relokv.Strategy("first_k", k=4))
    assert q.relocated_hits > 0 and q.exact_hits >= 1
    # first_k k=4: the first 4 tokens of each relocated span, and the question, are computed.
    assert q.tokens_to_compute == 4 + 4 + len(QUESTION)
    assert q.reused.sum() > 0 and "relocated" in repr(q)
    b = [x for x in q.blocks if x["status"] == "relocated"][0]
    assert cache.tokens_of(b["source"]).size == b["len"]
    canonical, principal = cache.origin(b["source"])
    assert principal == 0 and isinstance(canonical, bool)
    cache.release(q)


def test_strategies_by_name_and_kind():
    keys = [k for k, _, _ in relokv.strategies()]
    assert keys[0] == "full" and {"naive", "epic", "cacheblend", "kvboost"} <= set(keys)
    for k in keys:
        s = relokv.Strategy(k)
        assert s.key == k and s.name
    assert relokv.Strategy("prefix").spans is False
    assert relokv.Strategy("cacheblend").dynamic
    assert relokv.Strategy("deviation_topk", ratio=0.3).ratio == pytest.approx(0.3)
    assert relokv.Strategy("epic", k=8).k == 8


def test_provenance_policy():
    cache = relokv.Cache(64, BS)
    assert cache.provenance == "canonical_or_same_principal"
    cache.provenance = "permissive"
    assert cache.provenance == "permissive"
    with pytest.raises(relokv.Error, match="permissive"):
        cache.provenance = "anything"
    # Another principal's span computed after other text is not served relocated by default.
    strict = relokv.Cache(64, BS)
    p = strict.plan(layout((0, 1)), principal=1)
    strict.commit(p)
    strict.release(p)
    q = strict.plan(layout((1, 0)), principal=2)
    assert strict.stats["provenance_denied"] > 0
    strict.release(q)


def test_tenants_share_nothing():
    cache = relokv.Cache(64, BS)
    p = cache.plan(layout((0, 1)), tenant=1)
    cache.commit(p)
    cache.release(p)
    q = cache.plan(layout((0, 1)), tenant=2)
    assert q.exact_hits == 0 and q.relocated_hits == 0
    cache.release(q)


def test_out_of_blocks_takes_nothing():
    cache = relokv.Cache(4, BS)
    p = cache.plan(layout((0, 1, 2)))
    assert not p.ok and p.blocks_short > 0 and "out of blocks" in repr(p)
    assert cache.stats["out_of_blocks"] == 1 and cache.live_requests == 0
    with pytest.raises(relokv.Error):
        cache.commit(p)
    with pytest.raises(relokv.Error):
        cache.release(p)


def test_storage_view_shares_memory():
    cache = relokv.Cache(8, BS, store="memory:", kv_shape=(2, 2, 8))
    a = cache.kv
    assert a.shape == (2, 8, 2, 2, BS, 8) and a.dtype == np.float32
    a[1, 3, 1, 0, 2, 5] = 42.0
    assert cache.kv[1, 3, 1, 0, 2, 5] == 42.0
    assert np.shares_memory(a, cache.kv)
    assert relokv.Cache(8, BS).kv is None


def _write_and_read(url, reader_url=None, env=None):
    """A writer computes a request into its storage and commits; a reader with an empty pool
    plans the same request from the store. Returns (reader's plan, writer kv, reader kv)."""
    w = relokv.Cache(32, BS, store=url, kv_shape=(2, 2, 8), **(env or {}))
    p = w.plan(layout((0, 1)))
    rng = np.random.default_rng(1)
    kv = w.kv
    for b in p.blocks:
        kv[:, b["physical"]] = rng.standard_normal(kv[:, b["physical"]].shape, dtype=np.float32)
    w.commit(p)
    w.release(p)
    assert w.stats["store_writes"] > 0
    r = relokv.Cache(32, BS, store=reader_url or url, kv_shape=(2, 2, 8), **(env or {}))
    q = r.plan(layout((0, 1)))
    return q, p, w, r


def _check_store_hits(q, p, w, r):
    # Every block but the question's (computed in every request) came from the store.
    assert q.store_hits == len(q.blocks) - 1 == q.exact_hits + q.relocated_hits
    assert [b["tier"] for b in q.blocks] == ["store"] * (len(q.blocks) - 1) + ["computed"]
    for qb, pb in zip(q.blocks, p.blocks):
        if qb["tier"] == "store":
            n = qb["len"]
            np.testing.assert_array_equal(r.kv[:, qb["physical"], :, :, :n], w.kv[:, pb["physical"], :, :, :n])
    r.release(q)


def test_file_store_round_trip(tmp_path):
    _check_store_hits(*_write_and_read(f"file:{tmp_path}"))


def test_redis_store_round_trip(redis_url):
    _check_store_hits(*_write_and_read(redis_url))


def test_sealed_store(tmp_path, monkeypatch):
    monkeypatch.setenv("RELOKV_PY_SEAL", "11" * 32)
    q, p, w, r = _write_and_read(f"file:{tmp_path}", env={"seal_key_env": "RELOKV_PY_SEAL"})
    assert "(sealed)" in r.store
    _check_store_hits(q, p, w, r)
    # Without the key the sealed entries are not read as blocks.
    plain = relokv.Cache(32, BS, store=f"file:{tmp_path}", kv_shape=(2, 2, 8))
    x = plain.plan(layout((0, 1)))
    assert x.store_hits == 0
    plain.release(x)


def test_unreachable_store_costs_misses():
    cache = relokv.Cache(32, BS, store="redis://127.0.0.1:1", kv_shape=(2, 2, 8))
    p = cache.plan(layout((0, 1)))
    assert p.ok and p.store_hits == 0 and cache.stats["store_unavailable"] > 0
    cache.release(p)


def test_store_password_is_redacted():
    cache = relokv.Cache(32, BS, store="redis://alice:hunter2@127.0.0.1:1", kv_shape=(2, 2, 8))
    assert "hunter2" not in cache.store and "alice" in cache.store


BAD = [
    (lambda: relokv.LayoutBuilder(15), relokv.Error, "power of two"),
    (lambda: relokv.LayoutBuilder(0), relokv.Error, "power of two"),
    (lambda: relokv.LayoutBuilder(16, vocab=0), relokv.Error, "vocab"),
    (lambda: relokv.LayoutBuilder().prefix([1, -2]), ValueError, "index 1"),
    (lambda: relokv.LayoutBuilder().prefix([1, 2**31]), ValueError, "not a token id"),
    (lambda: relokv.LayoutBuilder().prefix(np.array([1, 2**40])), ValueError, "not a token id"),
    (lambda: relokv.LayoutBuilder().prefix([1, 2.5]), TypeError, "item 1"),
    (lambda: relokv.LayoutBuilder().prefix("hello"), TypeError, "not text"),
    (lambda: relokv.LayoutBuilder().prefix(np.zeros(3, np.float32)), TypeError, "integer"),
    (lambda: relokv.LayoutBuilder().prefix(None), TypeError, "incompatible function arguments"),
    (lambda: relokv.LayoutBuilder().prefix([]).build(), relokv.LayoutError, "empty"),
    (lambda: relokv.LayoutBuilder().build(), relokv.LayoutError, None),
    (lambda: relokv.LayoutBuilder().prefix([1]).question([2]).span([3]), relokv.LayoutError, "after question"),
    (lambda: relokv.LayoutBuilder(16, vocab=100).prefix([1, 100]).build(), relokv.LayoutError, "100"),
    (lambda: relokv.LayoutBuilder().dependent([1], last_n=-1), relokv.Error, "last_n"),
    (lambda: relokv.Strategy("sideways"), ValueError, "unknown strategy"),
    (lambda: relokv.Strategy("first_k", k=-1), relokv.Error, "k must"),
    (lambda: relokv.Strategy("deviation_topk", ratio=1.5), relokv.Error, "ratio"),
    (lambda: relokv.Cache(0), relokv.Error, "num_blocks"),
    (lambda: relokv.Cache(8, 12), relokv.Error, "power of two"),
    (lambda: relokv.Cache(8, hash="md5"), relokv.Error, "xxh3_128"),
    (lambda: relokv.Cache(8, pool="fifo"), relokv.Error, "lru"),
    (lambda: relokv.Cache(8, placement="sideways"), relokv.Error, "at_attention"),
    (lambda: relokv.Cache(8, strategy=3), TypeError, "Strategy"),
    (lambda: relokv.Cache(8, store="ftp://x"), relokv.Error, "ftp"),
    (lambda: relokv.Cache(8, store="memory:"), relokv.Error, "kv_shape"),
    (lambda: relokv.Cache(8, store="memory:", kv_shape=(0, 2, 8)), relokv.Error, "num_layers"),
    (lambda: relokv.Cache(8, store="memory:", kv_shape=(2, 2, 8), seal_key_env="RELOKV_PY_NO_SUCH_VAR"),
     relokv.Error, "RELOKV_PY_NO_SUCH_VAR"),
    (lambda: relokv.Cache(8, seal_key_env="X"), relokv.Error, "needs a store"),
    (lambda: relokv.Cache(8).plan(layout((0,), block_size=32)), relokv.Error, "block_size"),
    (lambda: relokv.Cache(8).commit(12345), relokv.Error, None),
    (lambda: relokv.Cache(8).release(-1), TypeError, None),
    (lambda: relokv.Cache(8).commit("x"), TypeError, "request id"),
    (lambda: relokv.Cache(8).origin(3), relokv.Error, "not cached"),
    (lambda: relokv.Cache(8).origin(-5), relokv.Error, "not cached"),
    (lambda: relokv.Cache(8).tokens_of(10**6), relokv.Error, "not cached"),
]


@pytest.mark.parametrize("call,exc,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_inputs_raise(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_release_twice_raises():
    cache = relokv.Cache(64, BS)
    p = cache.plan(layout((0,)))
    cache.release(p)
    with pytest.raises(relokv.Error):
        cache.release(p)
    with pytest.raises(relokv.Error):
        cache.commit(p)


def test_find_spans_cuts_a_plain_prompt_whatever_its_format():
    """relokv.find_spans (the span finder relokv_server --spans auto calls) on a prompt of one
    byte a token: labels stay outside the passages; a SpanIndex finds them again inline."""
    a = "The lighthouse on Skerry Point was built in 1852 by the engineer Alan Brodie."
    b = "Carrick is a fishing town on the west coast; its school dates from 1870."

    def run(text, known=None):
        ids = list(text.encode())
        segs = relokv.find_spans(ids, [chr(c) for c in ids], min_span=64, forced=[5],
                                 known=known)
        assert segs[0][1] == 0 and segs[-1][2] == len(ids)  # they tile the prompt
        assert all(s[2] == t[1] for s, t in zip(segs, segs[1:]))
        return [text[s[1]:s[2]] for s in segs if s[0] == "span"], segs

    known = relokv.SpanIndex(100)
    spans, _ = run("Hi:\n\n[1] " + a + "\n[2] " + b + "\nWhere?", known)
    assert spans == [a, b]
    assert len(known) == 2
    spans, segs = run("Hi:\n\nUse " + b + " and " + a + " now. Where?", known)
    assert spans == [b, a] and all(s[3] for s in segs if s[0] == "span")  # remembered
    with pytest.raises(relokv.Error, match="ids but"):
        relokv.find_spans([1, 2, 3], ["a"])
    with pytest.raises(relokv.Error, match="min_span"):
        relokv.find_spans([1], ["a"], min_span=0)
    with pytest.raises(relokv.Error, match="capacity"):
        relokv.SpanIndex(0)
