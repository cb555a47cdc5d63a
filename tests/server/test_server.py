"""relokv_server driven by real clients: the official `openai` package, curl, raw HTTP.

Run by ctest (server.pytest, through tests/server/run) against SmolLM2-135M-Instruct; every
server listens on 127.0.0.1 and a free port and is stopped by its fixture."""
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from serverlib import Redis, Server, SlowProxy

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It "
    "is named after the engineer Gustave Eiffel, whose company designed and built the tower.",
    {"id": "berlin", "title": "Berlin", "text": "Berlin is the capital and largest city of "
     "Germany; the Brandenburg Gate stands in its centre."},
    {"id": "nile", "text": "The Nile is a major north-flowing river in northeastern Africa. It "
     "flows into the Mediterranean Sea and is about 6,650 km long."},
]
SYSTEM = "Answer the question from the documents, in a few words."


@pytest.fixture(scope="module")
def srv():
    s = Server("--parallel", 16, "--queue", 64)
    yield s
    assert s.stop() == 0, s.output()


def client(s, **kw):
    return openai.OpenAI(base_url=s.url, api_key=kw.pop("api_key", "none"), max_retries=0,
                         timeout=300, **kw)


def ask(s, question, docs=(), strategy=None, max_tokens=24, **kw):
    extra = {}
    if docs:
        extra["documents"] = list(docs)
    if strategy:
        extra["relokv"] = {"strategy": strategy}
    return client(s).chat.completions.create(
        model="relokv", messages=[{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": question}],
        max_tokens=max_tokens, temperature=0, extra_body=extra, **kw)


def post(s, body, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(s.url + "/chat/completions", data=data,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def test_models_health_metrics(srv):
    assert json.loads(srv.get("/health")) == {"status": "ok"}
    models = client(srv).models.list()
    assert len(models.data) == 1 and models.data[0].id
    text = srv.get("/metrics")
    for name in ("relokv_requests_total", "relokv_time_to_first_token_seconds_bucket",
                 "relokv_inter_token_latency_seconds_bucket", "relokv_prompt_tokens_total",
                 "relokv_kv_blocks_in_use", "relokv_cache_evictions_total",
                 "relokv_preemptions_total", "relokv_store_hits_total",
                 "relokv_store_rejections_total"):
        assert name in text, name


def test_answer_and_usage(srv):
    r = ask(srv, "Who designed the Eiffel Tower?", DOCS[:1], strategy="full")
    assert r.object == "chat.completion"
    assert "Eiffel" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 40 and u.completion_tokens >= 1
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_stream_equals_non_stream(srv):
    kw = dict(docs=DOCS[:2], strategy="full", max_tokens=20)
    whole = ask(srv, "What stands in the centre of Berlin?", **kw).choices[0].message.content
    stream = ask(srv, "What stands in the centre of Berlin?", stream=True,
                 stream_options={"include_usage": True}, **kw)
    pieces, finish, usage = [], None, None
    for c in stream:
        if c.usage:
            usage = c.usage
        for ch in c.choices:
            pieces.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert "".join(pieces) == whole
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens >= 1


def test_documents_reused_in_any_order(srv):
    q = "How long is the Nile?"
    first = ask(srv, q, [DOCS[2], DOCS[0]], strategy="epic")
    again = ask(srv, q, [DOCS[0], DOCS[2]], strategy="epic")  # the other order
    # Both documents were cached by the first request: the second reuses them where they now
    # stand (relocated), computing only EPIC's first tokens of each and the question.
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens > 0.4 * again.usage.prompt_tokens


def test_stop_sequences(srv):
    r = ask(srv, "Count from one to ten in words, separated by commas.", max_tokens=40,
            stop=[","])
    assert "," not in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    # Streamed, no piece of a stop sequence is ever sent (text that could still become one is
    # held back until it cannot). SmolLM2 answers "Say hi." with "I'm here to help with your
    # research. ..."; the stop spans three of its tokens.
    full = ask(srv, "Say hi.", max_tokens=24).choices[0].message.content
    stop = "p with y"
    assert stop in full, full
    cut = ask(srv, "Say hi.", max_tokens=24, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == full[:full.index(stop)]
    chunks = list(ask(srv, "Say hi.", max_tokens=24, stop=[stop], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == cut.message.content


def test_seeded_sampling_is_repeatable(srv):
    def once():
        return client(srv).chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Write a word about the sea."}],
            max_tokens=12, temperature=1.0, seed=1234).choices[0].message.content
    assert once() == once()


def test_errors_are_openai_style_and_the_server_keeps_serving(srv):
    cases = [
        (b"{not json", 400, None),
        ({"messages": "hello"}, 400, "messages"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, 400,
         "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, 400, "temperature"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x"}], "documents": [{"title": "t"}]}, 400,
         "documents[0].text"),
        ({"messages": [{"role": "user", "content": "x"}], "documents": ["d"] * 33}, 400,
         "documents"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "relokv": {"strategy": "magic"}}, 400,
         "relokv.strategy"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
         400, "messages"),
        ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400, "messages"),
    ]
    for body, status, param in cases:
        code, _, err = post(srv, body)
        assert code == status, (body, err)
        assert set(err["error"]) >= {"message", "type", "param", "code"}, err
        if param:
            assert err["error"]["param"] == param, err
    code, _, err = post(srv, {"messages": [{"role": "user", "content": "word " * 5000}]})
    assert err["error"]["code"] == "context_length_exceeded"
    code, _, err = post(srv, b'{"messages": "' + b"x" * (2 << 20) + b'"}')
    assert code == 413 and "error" in err
    code, _, _ = post(srv, {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
    assert code == 200


def test_text_cut_inside_a_character_and_bytes_that_are_not_utf8(srv):
    # Sampled answers cut by max_tokens end inside a multi-byte character now and then; the
    # JSON writer refused such text (a stream's provider threw: the server terminated). And an
    # error message quoting a body of invalid UTF-8 must still be written.
    for seed in range(12):
        r = client(srv).chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Write emoji and Chinese: "}],
            max_tokens=3, temperature=2.0, seed=seed, stream=seed % 2 == 0)
        if seed % 2 == 0:
            assert "".join(c.choices[0].delta.content or "" for c in r if c.choices) is not None
        else:
            assert r.choices[0].message.content is not None
    code, _, err = post(srv, b'{"messages": "\xff\xfe')
    assert code == 400 and "error" in err
    assert json.loads(srv.get("/health")) == {"status": "ok"}


def test_curl(srv):
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    out = subprocess.run(["curl", "-sS", "--max-time", "120", srv.url + "/chat/completions",
                          "-H", "Content-Type: application/json", "-d", body],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["choices"][0]["message"]["content"]
    out = subprocess.run(["curl", "-sSN", "--max-time", "120", srv.url + "/chat/completions",
                          "-H", "Content-Type: application/json", "-d",
                          json.dumps({**json.loads(body), "stream": True})],
                         capture_output=True, text=True, check=True).stdout
    events = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["object"] == "chat.completion.chunk"


def test_answers_do_not_depend_on_the_load(srv):
    # Greedy answers under full recompute, and under exact (prefix) hits of a shared system
    # prompt, are the same bits alone and among 16 concurrent requests (batch-invariant
    # products; a prompt in chunks equals it at once).
    questions = [f"Name one thing about {t}." for t in
                 ("rivers", "Paris", "Berlin", "the Nile", "towers", "gates", "seas", "maps",
                  "bridges", "iron", "engineers", "capitals", "Africa", "France", "Germany",
                  "lattices")]
    def run(q, strategy):
        return ask(srv, q, DOCS[:2], strategy=strategy, max_tokens=10).choices[0].message.content
    alone = [run(q, "full") for q in questions]
    # Prefix caching's exact hits are exact: under load its answers are full recompute's too.
    for strategy in ("full", "prefix"):
        before = srv.metric("relokv_preemptions_total")
        hits = srv.metric('relokv_cache_blocks_total{kind="exact"}')
        with cf.ThreadPoolExecutor(16) as ex:
            together = list(ex.map(lambda q: run(q, strategy), questions))
        assert srv.metric("relokv_preemptions_total") == before
        assert together == alone, strategy
    assert srv.metric('relokv_cache_blocks_total{kind="exact"}') > hits  # prefix hit something


def test_requests_that_share_new_documents_wait_and_reuse(srv):
    # Four requests at once show the same three new documents in other orders. Admitted
    # together, each would compute all three; instead the first computes them while the others
    # are held back (relokv_span_waits_total), and they reuse its spans as soon as its prompt is
    # done: a prompt is committed at its first token, not when its answer ends.
    docs = [f"Document {name}: " + " ".join(f"{name} fact {i} is about the river {name}." for i in range(6))
            for name in ("Oxbow", "Meander", "Delta")]
    waits = srv.metric("relokv_span_waits_total")
    orders = [[0, 1, 2], [2, 0, 1], [1, 2, 0], [2, 1, 0]]
    with cf.ThreadPoolExecutor(4) as ex:
        rs = list(ex.map(lambda o: ask(srv, "Which river is named first?", [docs[i] for i in o],
                                       strategy="epic", max_tokens=24), orders))
    reused = [r.usage.prompt_tokens_details.cached_tokens / r.usage.prompt_tokens for r in rs]
    assert srv.metric("relokv_span_waits_total") > waits
    # Three of the four reused the documents (more than half of their prompt), not only the
    # system prompt's exact prefix.
    assert sum(f > 0.5 for f in reused) >= 3, reused


def test_client_that_disconnects_is_released(srv):
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}],
                       "max_tokens": 400, "stream": True}).encode()
    req = urllib.request.Request(srv.url + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=60)
    r.readline()
    r.readline()
    r.close()  # gone mid-answer
    deadline = time.time() + 60
    while time.time() < deadline:
        if (srv.metric('relokv_requests_total{status="499"}') or 0) >= 1 and \
                srv.metric("relokv_requests_running") == 0 and \
                srv.metric("relokv_kv_blocks_in_use") == 0:
            break
        time.sleep(0.2)
    assert srv.metric('relokv_requests_total{status="499"}') >= 1
    assert srv.metric("relokv_requests_running") == 0
    assert srv.metric("relokv_kv_blocks_in_use") == 0


def test_full_queue_answers_503_with_retry_after():
    s = Server("--parallel", 1, "--queue", 1)
    try:
        body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 48}
        with cf.ThreadPoolExecutor(6) as ex:
            results = list(ex.map(lambda _: post(s, body), range(6)))
        codes = sorted(code for code, _, _ in results)
        assert 503 in codes and 200 in codes, codes
        for code, headers, err in results:
            if code == 503:
                assert headers.get("Retry-After") == "1"
                assert err["error"]["code"] == "queue_full"
        assert post(s, {**body, "max_tokens": 2})[0] == 200
    finally:
        assert s.stop() == 0


def test_out_of_blocks_preempts_and_every_request_completes():
    # A pool of 18 blocks (one request of the 256-token context) for 4 parallel requests of
    # about 7 blocks each: decode runs out and preempts; nobody fails.
    s = Server("--parallel", 4, "--ctx", 256, "--kv-blocks", 18)
    try:
        qs = [f"Write about {t}." for t in ("rain", "snow", "wind", "sun", "fog", "hail")]
        def run(q):
            return client(s).chat.completions.create(
                model="x", messages=[{"role": "user", "content": q}], max_tokens=60,
                temperature=0, extra_body={"relokv": {"strategy": "full"}})
        with cf.ThreadPoolExecutor(6) as ex:
            out = list(ex.map(run, qs))
        assert all(r.choices[0].finish_reason in ("stop", "length") for r in out)
        assert s.metric("relokv_preemptions_total") > 0
        # The gauges are the scheduler's snapshot at the end of its step, which may come a
        # moment after the last answer reached its client: wait for that step, briefly.
        deadline = time.time() + 5
        while time.time() < deadline and s.metric("relokv_kv_blocks_in_use") != 0:
            time.sleep(0.05)
        assert s.metric("relokv_kv_blocks_in_use") == 0
    finally:
        assert s.stop() == 0


def test_escalation_before_the_first_token():
    # entropy>0@first escalates every request (no softmax has zero entropy): each is recomputed
    # in full before its first token, so it answers as full recompute does, and says so.
    s = Server("--escalate", "entropy>0@first", "--strategy", "naive", "--parallel", 4)
    try:
        ask(s, "Warm the spans.", DOCS[:2], max_tokens=1)
        q = "Who designed the Eiffel Tower?"
        docs = [DOCS[1], DOCS[0]]  # relocated
        full = ask(s, q, docs, strategy="full", max_tokens=12)
        before = s.metric("relokv_escalations_total")
        esc = ask(s, q, docs, max_tokens=12)
        assert esc.choices[0].message.content == full.choices[0].message.content
        info = esc.model_dump()["relokv"]
        assert info["escalated"] is True
        assert info["strategy"] == "naive + entropy>0@first"
        assert info["work"] > 1.0  # the first attempt and the full prefill both count
        assert s.metric("relokv_escalations_total") == before + 1
        # A request that names its strategy is served as it asks, without the policy.
        assert ask(s, q, docs, strategy="naive", max_tokens=4).model_dump()["relokv"][
            "escalated"] is False
    finally:
        assert s.stop() == 0
    # Only @first: a policy that would take back streamed tokens is refused at start-up.
    with pytest.raises(RuntimeError, match="before the first token only"):
        Server("--escalate", "margin<0.3@every")


def test_api_keys_are_tenants():
    s = Server("--api-key", "k1:alice", "--api-key", "k2:bob")
    try:
        with pytest.raises(openai.AuthenticationError):
            client(s, api_key="wrong").chat.completions.create(
                model="x", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        def as_(key):
            return client(s, api_key=key).chat.completions.create(
                model="x", messages=[{"role": "user", "content": "Who designed it?"}],
                max_tokens=2, extra_body={"documents": DOCS[:1], "relokv": {"strategy": "naive"}})
        assert as_("k1").usage.prompt_tokens_details.cached_tokens == 0
        assert as_("k2").usage.prompt_tokens_details.cached_tokens == 0  # alice's spans: not bob's
        assert as_("k1").usage.prompt_tokens_details.cached_tokens > 0
    finally:
        assert s.stop() == 0


@pytest.fixture
def redis():
    """redis-server on loopback, stopped after the test (a skip without it, a failure in CI)."""
    try:
        r = Redis()
    except RuntimeError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(e))
    yield r
    r.stop()


def store_documents(url, question):
    """Has a server on the store at `url` answer `question` over DOCS, then stops it: the
    store holds their spans (its writes, behind the request, are drained at its stop)."""
    s = Server("--store", url)
    try:
        ask(s, question, DOCS, strategy="naive")
    finally:
        s.stop()


def test_two_servers_share_spans_through_redis(tmp_path, redis):
    key = tmp_path / "seal.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    a = b = None
    try:
        a = Server("--store", redis.url, "--store-key-file", key)
        b = Server("--store", redis.url, "--store-key-file", key)
        q = "Where does the Nile flow?"
        ask(a, q, DOCS, strategy="naive")
        time.sleep(1)  # the writes are behind the request
        got = ask(b, q, list(reversed(DOCS)), strategy="naive")
        assert got.usage.prompt_tokens_details.cached_tokens > 0.5 * got.usage.prompt_tokens
        assert b.metric("relokv_store_hits_total") > 0
    finally:
        for s in (a, b):
            if s:
                s.stop()


def test_store_fetches_never_stall_the_batch(redis):
    # A request whose documents are in a slow store waits for them off the scheduler's thread
    # (relokv_store_prefetch_waits_total) while another request goes on decoding; then it
    # reads them from what was fetched. A fetch made on the scheduler's thread would stop every
    # stream for the store's round trip.
    q = "Where does the Nile flow?"
    store_documents(redis.url, q)
    proxy = SlowProxy(redis.port)
    b = None
    delay = 0.9  # within the store's deadline (1 s a call)
    try:
        b = Server("--store", proxy.url)
        body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}],
                           "max_tokens": 400, "stream": True, "temperature": 0}).encode()
        req = urllib.request.Request(b.url + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        stream = urllib.request.urlopen(req, timeout=120)
        times = []
        for _ in range(3):
            stream.readline()
        proxy.delay = delay
        with cf.ThreadPoolExecutor(1) as ex:
            t0 = time.time()
            fut = ex.submit(ask, b, q, list(reversed(DOCS)), strategy="naive", max_tokens=4)
            while not fut.done():
                line = stream.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    times.append(time.time())
            got = fut.result()
            took = time.time() - t0
        stream.close()
        assert took >= delay  # it did wait for the store
        assert got.usage.prompt_tokens_details.cached_tokens > 0.5 * got.usage.prompt_tokens
        assert b.metric("relokv_store_hits_total") > 0
        gaps = [y - x for x, y in zip(times, times[1:])]
        assert len(gaps) >= 5, times
        # The other stream went on while the documents were fetched: a fetch on the scheduler's
        # thread would leave a gap of the whole round trip (>= delay); a loaded 2-core machine
        # leaves gaps of up to ~0.8 s without one (measured beside `yes` on both cores), so the
        # bound is the round trip itself, not a fraction of it.
        assert max(gaps) < delay, gaps
        assert b.metric("relokv_store_prefetch_waits_total") >= 1
    finally:
        if b:
            b.stop()
        proxy.stop()


def test_store_prefetch_budget_bounds_what_is_staged(redis):
    # --store-prefetch-mib 1: a few of SmolLM2's blocks fit (at most 360 KiB each, less for a
    # span's short last block); the request's other stored blocks are computed, not fetched,
    # where a server with the default budget fetches them all.
    q = "Where does the Nile flow?"
    store_documents(redis.url, q)
    b = c = None
    try:
        b = Server("--store", redis.url, "--store-prefetch-mib", 1)
        c = Server("--store", redis.url)
        small = ask(b, q, list(reversed(DOCS)), strategy="naive")
        whole = ask(c, q, list(reversed(DOCS)), strategy="naive")
        assert 0 < b.metric("relokv_store_hits_total") < c.metric("relokv_store_hits_total")
        assert small.usage.prompt_tokens_details.cached_tokens < \
            whole.usage.prompt_tokens_details.cached_tokens
    finally:
        for s in (b, c):
            if s:
                s.stop()


def test_sigterm_drains_requests_in_flight():
    s = Server()
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a story."}],
                       "max_tokens": 64, "stream": True}).encode()
    req = urllib.request.Request(s.url + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=120)
    first = r.readline()
    assert first.startswith(b"data: ")
    s.proc.send_signal(signal.SIGTERM)
    rest = r.read().decode()
    assert rest.rstrip().endswith("data: [DONE]")
    assert '"finish_reason":"length"' in rest or '"finish_reason":"stop"' in rest
    assert s.proc.wait(60) == 0
    s.log.close()


def test_load_over_the_sample_answers_as_alone():
    # bench/serve_load.py over the 2WikiMultihopQA sample, Zipf-popular questions with their
    # passages in new orders: each request alone (the reference), then 4 users at once under
    # full recompute: no failure, no answer that differs, memory bounded.
    import sys
    s = Server("--parallel", 4)
    try:
        load = [sys.executable, os.path.join(os.path.dirname(__file__), "..", "..", "bench",
                                             "serve_load.py"),
                "--url", s.url, "--requests", "8", "--docs", "2", "--max-tokens", "6",
                "--strategy", "full", "--deadline", "600"]
        ref = os.path.join(os.path.dirname(s.log.name), f"relokv_ref_{s.port}.json")
        out = subprocess.run(load + ["--write-reference", ref], capture_output=True, text=True,
                             check=True, timeout=700).stdout
        assert "failed 0" in out, out
        rss_before = s.rss_kib()
        out = subprocess.run(load + ["--users", "4", "--reference", ref], capture_output=True,
                             text=True, check=True, timeout=700).stdout
        figures = dict(line.split() for line in out.splitlines())
        assert figures["failed"] == "0", out
        assert figures["differ"] == "0", out
        # The pool is allocated up front; serving touches its pages, nothing grows past them.
        assert s.rss_kib() - rss_before < 256 * 1024
        os.unlink(ref)
    finally:
        assert s.stop() == 0


def test_llama_cpp_engine_serves_the_same_api():
    # relokv inside llama.cpp behind the same server (a build with llama.cpp: --long).
    try:
        s = Server("--engine", "llama.cpp", "--parallel", 4)
    except RuntimeError as e:
        if "without llama.cpp" in str(e):
            pytest.skip("this relokv_server has no llama.cpp (./scripts/test --long builds it)")
        raise
    try:
        q = "How long is the Nile?"
        first = ask(s, q, [DOCS[2], DOCS[0]], strategy="epic")
        again = ask(s, q, [DOCS[0], DOCS[2]], strategy="epic")
        assert first.choices[0].message.content
        assert again.usage.prompt_tokens_details.cached_tokens > 0.4 * again.usage.prompt_tokens
        # Plain prompts (no documents field): the server's span finder (relokv::find_spans)
        # cuts them for this engine as for relokv's own, so passages recur in another order.
        for fmt in ("langchain", "markdown"):
            ask_plain(s, fmt, [DOCS[0], DOCS[2], DOCS[1]], q)
            again = ask_plain(s, fmt, [DOCS[2], DOCS[1], DOCS[0]], q)
            reused = again.usage.prompt_tokens_details.cached_tokens
            assert reused > 0.35 * again.usage.prompt_tokens, (fmt, again.usage)
        code, _, err = post(s, {"messages": [{"role": "user", "content": "x"}],
                                "relokv": {"strategy": "cacheblend"}})
        assert code == 400, err  # a strategy with a per-layer hook: refused, not a crash
        with cf.ThreadPoolExecutor(3) as ex:  # one sequence at a time: queued, all answered
            out = list(ex.map(lambda q: ask(s, q, DOCS[:1], max_tokens=6),
                              ["Who?", "What?", "Where?"]))
        assert all(r.choices[0].message.content is not None for r in out)
        assert json.loads(s.get("/v1/models"))["data"][0]["meta"]["engine"] == "llama.cpp"
    finally:
        assert s.stop() == 0


ADAPTERS = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "links", "adapters")


def check_links_adapter(*engine, name="smollm2-135m.gguf"):
    """--links: /v1/models names the adapter; with --compile-spans alone a request's documents
    are compiled alone before it (as the rows were trained to read them), so its first request
    already reuses them, and another order reuses them too."""
    adapter = os.path.join(ADAPTERS, name)
    s = Server("--links", adapter, "--strategy", "naive", "--compile-spans", "alone", *engine)
    try:
        meta = json.loads(s.get("/v1/models"))["data"][0]["meta"]
        assert meta["links"]["rows"] >= 1 and meta["links"]["file"] == name
        q = "How long is the Nile?"
        first = ask(s, q, [DOCS[2], DOCS[0]])
        compiled = [l for l in s.get("/metrics").splitlines()
                    if l.startswith("relokv_spans_compiled_total ")]
        assert compiled == ["relokv_spans_compiled_total 2"], compiled
        assert first.usage.prompt_tokens_details.cached_tokens > 0.4 * first.usage.prompt_tokens
        info = post(s, {"messages": [{"role": "user", "content": "Why?"}],
                        "documents": [DOCS[1]], "max_tokens": 2})[2]["relokv"]
        assert info["compiled_tokens"] > 0, info
        again = ask(s, q, [DOCS[0], DOCS[2]])
        assert again.choices[0].message.content
        assert again.usage.prompt_tokens_details.cached_tokens > 0.4 * again.usage.prompt_tokens
        assert first.usage.prompt_tokens == again.usage.prompt_tokens
    finally:
        assert s.stop() == 0, s.output()


def test_llama_cpp_engine_reads_links():
    # The adapter's rows as llama_batch.embd (a build with llama.cpp: --long).
    try:
        check_links_adapter("--engine", "llama.cpp")
    except RuntimeError as e:
        if "without llama.cpp" in str(e):
            pytest.skip("this relokv_server has no llama.cpp (./scripts/test --long builds it)")
        raise


def test_learned_deep_adapter():
    """The learned adapter (deep rows: per-layer K/V, tools/links/distill.py) on relokv's engine
    serves as the shallow one does; relokv inside llama.cpp refuses it at start, naming why."""
    check_links_adapter(name="smollm2-135m-learned.gguf")
    p = subprocess.run([os.environ["RELOKV_SERVER_BIN"], "--links",
                        os.path.join(ADAPTERS, "smollm2-135m-learned.gguf"), "--engine",
                        "llama.cpp", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "deep" in p.stderr or "without llama.cpp" in p.stderr, p.stderr


def test_links_adapter(tmp_path):
    """The adapter on relokv's engine; an adapter for another model is refused at start; by
    default a span first seen is computed in its request (nothing compiled alone)."""
    check_links_adapter()
    s = Server("--strategy", "naive")
    try:
        ask(s, "How long is the Nile?", [DOCS[2], DOCS[0]])
        assert "relokv_spans_compiled_total 0" in s.get("/metrics").splitlines()
    finally:
        assert s.stop() == 0, s.output()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    p = subprocess.run([os.environ["RELOKV_SERVER_BIN"], "--links", str(bad), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "bad.gguf" in p.stderr


def doc_text(d):
    return d if isinstance(d, str) else d["text"]


PLAIN_FORMATS = {
    # LangChain's "stuff" prompt, LlamaIndex's QA template, a markdown list.
    "langchain": lambda ctx, q: (
        "Use the following pieces of context to answer the question at the end. If you don't "
        "know the answer, just say that you don't know.\n\n" + "\n\n".join(ctx) +
        "\n\nQuestion: " + q + "\nHelpful Answer:"),
    "llamaindex": lambda ctx, q: (
        "Context information is below.\n---------------------\n" + "\n\n".join(ctx) +
        "\n---------------------\nGiven the context information and not prior knowledge, "
        "answer the query.\nQuery: " + q + "\nAnswer: "),
    "markdown": lambda ctx, q: (
        "Sources:\n" + "".join("- " + c + "\n" for c in ctx) + "\nQuestion: " + q),
}


def ask_plain(s, fmt, docs, question, strategy=None, max_tokens=8):
    extra = {"relokv": {"strategy": strategy}} if strategy else {}
    content = PLAIN_FORMATS[fmt]([doc_text(d) for d in docs], question)
    return client(s).chat.completions.create(
        model="relokv", messages=[{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": content}],
        max_tokens=max_tokens, temperature=0, extra_body=extra)


def test_spans_auto_reuses_passages_in_plain_prompts():
    """--spans auto (the default): passages pasted into the message text by the common RAG
    templates are reused in another order without any field of relokv's; under full
    recompute the answer is the one --spans off gives (the same tokens); --spans documents
    and off reuse nothing but the exact prefix."""
    q = "How long is the Nile?"
    answers = {}
    for mode in ("auto", "documents", "off"):
        s = Server("--spans", mode, "--strategy", "naive")
        try:
            meta = json.loads(s.get("/v1/models"))["data"][0]["meta"]
            assert meta["spans"] == mode
            for fmt in PLAIN_FORMATS:
                first = ask_plain(s, fmt, [DOCS[0], DOCS[2], DOCS[1]], q)
                again = ask_plain(s, fmt, [DOCS[2], DOCS[1], DOCS[0]], q)
                assert first.usage.prompt_tokens == again.usage.prompt_tokens
                reused = again.usage.prompt_tokens_details.cached_tokens
                if mode == "auto":
                    # The two long passages (Eiffel, Nile) come back relocated.
                    assert reused > 0.35 * again.usage.prompt_tokens, (fmt, again.usage)
                else:
                    assert reused < 0.35 * again.usage.prompt_tokens, (fmt, again.usage)
                full = ask_plain(s, fmt, [DOCS[1], DOCS[0], DOCS[2]], q, strategy="full",
                                 max_tokens=12)
                answers.setdefault(fmt, []).append(full.choices[0].message.content)
        finally:
            assert s.stop() == 0, s.output()
    for fmt, got in answers.items():
        assert len(set(got)) == 1, (fmt, got)
