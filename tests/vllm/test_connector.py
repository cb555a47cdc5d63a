"""relokv inside vLLM (relokv.vllm, docs/vllm.md): the connector's decisions with a scripted
scheduler, its reading of vLLM's CPU KV layout, its RoPE, and one end-to-end run of vLLM's CPU
build on SmolLM2 (exact hits as vLLM computes them, spans relocated, fallbacks, bad input).
Run by ./scripts/test --vllm (the vLLM environment of scripts/get-vllm; not in CI: the install
is 6 GB)."""
import os
import shutil
import types

import pytest

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")
import relokv  # noqa: E402
import relokv.vllm as rv  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

MODEL = os.environ.get("RELOKV_VLLM_MODEL", "")


# ---- a scripted scheduler --------------------------------------------------------------------

def fake_config(store, layers=2, heads=2, dim=32, vbs=32, theta=10000.0):
    hf = types.SimpleNamespace(model_type="llama", rope_theta=theta, rope_parameters=None,
                               rope_scaling=None)
    model = types.SimpleNamespace(
        model="fake", hf_text_config=hf, get_num_layers=lambda p: layers,
        get_num_kv_heads=lambda p: heads, get_head_size=lambda: dim)
    return types.SimpleNamespace(
        kv_transfer_config=KVTransferConfig(**rv.transfer_config(store, num_blocks=256)),
        model_config=model, parallel_config=None,
        cache_config=types.SimpleNamespace(block_size=vbs))


def request(rid, ids, extra):
    return types.SimpleNamespace(request_id=rid, prompt_token_ids=ids, num_tokens=len(ids),
                                 kv_transfer_params=extra.get("kv_transfer_params"))


def toks(seed, n):
    return [(seed * 7919 + i * 104729) % 30000 + 10 for i in range(n)]


@pytest.fixture()
def store(tmp_path):
    return "file:" + str(tmp_path / "store")


def commit_all(conn, layout):
    """What a worker does after prefill: every block before the question committed."""
    plan = conn.cache.plan(layout.build(conn.block_size, until=layout.question_start))
    conn.cache.commit(plan)
    conn.cache.release(plan)


def test_claims_only_what_relokv_holds_block_aligned_and_short_of_the_end(store):
    sched = rv.RelokvConnector(fake_config(store), KVConnectorRole.SCHEDULER, None)
    prefix, a, b, c, q = toks(1, 40), toks(2, 50), toks(3, 45), toks(4, 60), toks(5, 9)
    ids, extra = rv.layout_prompt(prefix, [a, b], q)
    r = request("r1", ids, extra)
    assert sched.get_num_new_matched_tokens(r, 0) == (0, False)  # nothing cached yet
    layout = rv._Layout.parse(extra["kv_transfer_params"], ids)
    commit_all(sched, layout)
    n, async_load = sched.get_num_new_matched_tokens(r, 0)
    assert not async_load
    assert n == (40 + 50 + 45) // 32 * 32  # up to the question, whole vLLM blocks
    assert sched.get_num_new_matched_tokens(r, 32) == (n - 32, False)  # after vLLM's own hit
    # The same spans in another order: relocated, claimed as well.
    ids2, extra2 = rv.layout_prompt(prefix, [b, a], q)
    assert sched.get_num_new_matched_tokens(request("r2", ids2, extra2), 0)[0] == n
    # A span never seen: the request is vLLM's own, whole.
    ids3, extra3 = rv.layout_prompt(prefix, [b, c, a], q)
    assert sched.get_num_new_matched_tokens(request("r3", ids3, extra3), 0) == (0, False)
    # Another tenant shares nothing.
    ids4, extra4 = rv.layout_prompt(prefix, [a, b], q, tenant=7)
    assert sched.get_num_new_matched_tokens(request("r4", ids4, extra4), 0) == (0, False)
    # Never the prompt's last token: a question of one token leaves it to vLLM.
    ids5, extra5 = rv.layout_prompt(prefix, [a, b, a[:1] + b[:31]], [7])
    lay5 = rv._Layout.parse(extra5["kv_transfer_params"], ids5)
    commit_all(sched, lay5)
    got = sched.get_num_new_matched_tokens(request("r5", ids5, extra5), 0)[0]
    assert got <= len(ids5) - 1 and got % 32 == 0


def test_requests_without_relokv_or_with_bad_layouts_fall_back_with_a_clear_error(store):
    sched = rv.RelokvConnector(fake_config(store), KVConnectorRole.SCHEDULER, None)
    ids = toks(1, 80)
    assert sched.get_num_new_matched_tokens(request("plain", ids, {}), 0) == (0, False)
    bad = [
        {"relokv": {"segments": [["prefix", 40], ["span", 30]]}},  # sums to 70, prompt 80
        {"relokv": {"segments": [["prefix", 40], ["span", 40]]}},  # no question
        {"relokv": {"segments": [["span", 40], ["question", 40]]}},  # no prefix first
        {"relokv": {"segments": [["prefix", 40], ["chapter", 30], ["question", 10]]}},
        {"relokv": {"segments": [["prefix", 40], ["span", -1], ["question", 41]]}},
        {"relokv": {"segments": "all of it"}},
        {"relokv": {"segments": [["prefix", 70], ["question", 10]], "tenant": -3}},
    ]
    for i, params in enumerate(bad):
        r = request(f"bad{i}", ids, {"kv_transfer_params": params})
        assert sched.get_num_new_matched_tokens(r, 0) == (0, False)
        keep, out = sched.request_finished(r, [])
        assert keep is False and "relokv:" in out["relokv"]["error"], params


class CharTokenizer:
    """One token per character (its code point): the span finder's cuts without a model."""
    unk_token_id = None

    def decode(self, ids):
        return "".join(chr(t) for t in ids)


TITLED = [("Nile", "The Nile is a major north-flowing river in northeastern Africa, about "
                   "6,650 km long."),
          ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower on the Champ de "
                           "Mars in Paris, France."),
          ("Mount Fuji", 'Mount Fuji is the highest mountain in Japan. "It is an active '
                         'volcano."'),
          ("Great Wall", "The Great Wall of China is a series of fortifications across "
                         "northern China.")]
FORMATS = {  # (opening, one passage, between passages, closing before the question)
    "stuff": ("Use the following pieces of context to answer the question at the end.\n\n",
              "{t}\n{x}", "\n\n", "\n\nQuestion: "),
    "documents": ("Answer from the documents.\n", "Document: {t}\n{x}", "\n", "\nQuestion: "),
    "xml": ("Answer from the sources.\n<sources>\n", '<source title="{t}">\n{x}\n</source>',
            "\n", "\n</sources>\nQuestion: "),
    "numbered": ("Answer with the numbered sources.\n\n", "[{n}] {t}\n{x}", "\n\n",
                 "\n\nQuestion: ")}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_plain_prompts_with_titled_passages_are_claimed_in_any_order(store, fmt):
    """spans "auto": a passage's title (or its tags) between two passages is text vLLM cannot
    compute between two claimed spans; it is a span of its own, and what is left of the line
    before it (a closing quote) ends the span before, so that every passage's
    span holds the same tokens wherever it stands, and a reordered prompt is claimed whole.
    A label that follows the order ("[3] ") is a span of its own, seen once any passage stood
    there."""
    sched = rv.RelokvConnector(fake_config(store), KVConnectorRole.SCHEDULER, None)
    sched.spans, sched._tok, sched._turn_ids = "auto", CharTokenizer(), set()
    head, one, sep, tail = FORMATS[fmt]

    def prompt(order, question="How long is the Nile?"):
        text = (head + sep.join(one.format(t=TITLED[i][0], x=TITLED[i][1], n=k + 1)
                                for k, i in enumerate(order))
                + tail + question)
        return [ord(c) for c in text]

    def spans(layout):
        out, at = [], 0
        for kind, n in layout.segments:
            if kind == "span":
                out.append("".join(chr(t) for t in layout.ids[at:at + n]))
            at += n
        return out

    first = sched._found(prompt([0, 1, 2, 3]), 0)
    commit_all(sched, first)
    order = [2, 0, 3, 1]
    ids = prompt(order, "Where is the Eiffel Tower?")
    again = sched._found(ids, 0)
    assert sorted(spans(again)) == sorted(spans(first))
    for i in order:  # each passage's header (its title line, but a label) is in one span
        header = one.replace("[{n}] ", "").split("{x}")[0].format(t=TITLED[i][0]).strip()
        assert sum(header in s for s in spans(again)) == 1, header
    got = sched.get_num_new_matched_tokens(request("reordered", ids, {}), 0)[0]
    assert got == again.question_start // 32 * 32 > 0.8 * len(ids)


def test_refuses_what_it_cannot_serve(store, tmp_path):
    with pytest.raises(ValueError, match="store"):
        rv.RelokvConnector(fake_config(""), KVConnectorRole.SCHEDULER, None)
    with pytest.raises(ValueError, match="per process"):
        rv.RelokvConnector(fake_config("memory:"), KVConnectorRole.SCHEDULER, None)
    cfg = fake_config(store)
    cfg.model_config.hf_text_config.rope_parameters = {"rope_type": "llama3", "rope_theta": 5e5}
    with pytest.raises(ValueError, match="RoPE scaling"):
        rv.RelokvConnector(cfg, KVConnectorRole.SCHEDULER, None)


def test_rope_rotates_as_vllm_and_back():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    hf = types.SimpleNamespace(rope_theta=100000.0, rope_parameters=None, rope_scaling=None)
    rope = rv._Rope(hf, 64)
    with set_current_vllm_config(VllmConfig()):  # vLLM's ops read the config they run under
        theirs = get_rope(64, max_position=4096, is_neox_style=True,
                          rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})
    pos = torch.tensor([0, 1, 17, 500, 2047])
    k = torch.randn(5, 3, 64)
    q = torch.randn(5, 3 * 64)
    _, want = theirs.forward_native(pos, q, k.reshape(5, 3 * 64).clone())
    got = rope.rotate(k, pos)
    assert torch.allclose(got.reshape(5, -1), want, atol=1e-6)
    assert torch.allclose(rope.rotate(got, pos, sign=-1.0), k, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reads_back_what_vllm_writes_in_its_cpu_layout(dtype):
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    bs, heads, dim, nb = 32, 2, 64, 5
    isa = _get_attn_isa(dtype, bs, dim)
    codec = rv._CpuCacheCodec(isa, dtype, bs, heads, dim)
    layer = torch.zeros(nb, heads, bs, 2 * dim, dtype=dtype)
    slots = torch.tensor([3, 40, 41, 95, 130, 159])
    k = torch.randn(len(slots), heads, dim).to(dtype)
    v = torch.randn(len(slots), heads, dim).to(dtype)
    codec.write(layer, k, v, slots)
    k2, v2 = codec.read(layer, slots // bs, slots % bs)
    assert torch.equal(k2, k.to(torch.float32)), isa
    assert torch.equal(v2, v.to(torch.float32)), isa


def worker(store, vbs=32, heads=2, dim=32, layers=2, nb=16):
    """A worker-side connector over a fake vLLM cache of `nb` blocks per layer (float32)."""
    w = rv.RelokvConnector(fake_config(store, layers=layers, heads=heads, dim=dim, vbs=vbs),
                           KVConnectorRole.WORKER, None)
    w.register_kv_caches({f"model.layers.{i}.self_attn.attn":
                          torch.zeros(nb, heads, vbs, 2 * dim) for i in range(layers)})
    return w


def test_worker_saves_what_vllm_computed_and_loads_it_relocated(store):
    prefix, a, b, q = toks(1, 40), toks(2, 50), toks(3, 45), toks(4, 9)
    ids, extra = rv.layout_prompt(prefix, [a, b], q)
    layout = rv._Layout.parse(extra["kv_transfer_params"], ids)
    w1 = worker(store)
    codec = w1._codec_for()
    rope = w1.rope
    # What vLLM's forward wrote: keys rotated at their positions, in blocks 3, 7, 1, 9.
    blocks1 = [3, 7, 1, 9, 11, 12]
    n = len(ids)
    pos = torch.arange(n)
    raw_k = {name: torch.randn(n, 2, 32) for name in w1._layers}
    raw_v = {name: torch.randn(n, 2, 32) for name in w1._layers}
    for name, layer in w1._layers.items():
        codec.write(layer, rope.rotate(raw_k[name], pos), raw_v[name],
                    w1._slots(rv._Transfer("a", layout, blocks1, 0, n), pos))
    w1.bind_connector_metadata(rv.RelokvMetadata(
        saves=[rv._Transfer("a", layout, blocks1, 0, layout.question_start)]))
    w1.wait_for_save()
    w1.clear_connector_metadata()
    assert w1.stats["saved_blocks"] > 0
    # Another process (a fresh cache on the same store), the spans in the other order.
    ids2, extra2 = rv.layout_prompt(prefix, [b, a], q)
    layout2 = rv._Layout.parse(extra2["kv_transfer_params"], ids2)
    w2 = worker(store)
    blocks2 = [5, 2, 8, 0, 4, 6]
    end = layout2.question_start // 32 * 32
    w2.bind_connector_metadata(rv.RelokvMetadata(
        loads=[rv._Transfer("b", layout2, blocks2, 0, end)]))
    w2.start_load_kv(None)
    w2.clear_connector_metadata()
    assert w2.get_block_ids_with_load_errors() == set()
    # Token i of the second prompt holds the first prompt's K/V of the same token, its key
    # rotated at i.
    src = {**{j: j for j in range(40)},  # the prefix, exact
           **{40 + j: 90 + j for j in range(45) if 40 + j < end},  # b, first at 90
           **{85 + j: 40 + j for j in range(50) if 85 + j < end}}  # a, first at 40
    at = torch.tensor(sorted(src))
    slots = w2._slots(rv._Transfer("b", layout2, blocks2, 0, end), at)
    for name, layer in w2._layers.items():
        k, v = codec.read(layer, slots // 32, slots % 32)
        from_ = torch.tensor([src[int(i)] for i in at])
        assert torch.allclose(v, raw_v[name][from_], atol=1e-6)
        assert torch.allclose(k, rope.rotate(raw_k[name][from_], at), atol=1e-4)


def test_worker_reports_a_claimed_block_the_store_lost(store):
    prefix, a, q = toks(1, 40), toks(2, 50), toks(4, 9)
    ids, extra = rv.layout_prompt(prefix, [a], q)
    layout = rv._Layout.parse(extra["kv_transfer_params"], ids)
    w = worker(store)
    w.bind_connector_metadata(
        rv.RelokvMetadata(loads=[rv._Transfer("x", layout, [4, 9, 2], 0, 64)]))
    w.start_load_kv(None)  # nothing was ever saved: vLLM recomputes both claimed blocks
    assert w.get_block_ids_with_load_errors() == {4, 9}
    assert w.get_block_ids_with_load_errors() == set()


# ---- vLLM itself --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    if not MODEL:
        pytest.skip("RELOKV_VLLM_MODEL is not set (./scripts/test --vllm converts SmolLM2)")
    from transformers import AutoTokenizer
    from vllm import LLM
    store = tmp_path_factory.mktemp("vllm-store")
    kw = dict(model=MODEL, dtype="float32", max_model_len=2048, enforce_eager=True,
              skip_tokenizer_init=True, block_size=32, seed=0)
    # One engine: vLLM's prefix caching off, so that every hit is relokv's.
    llm = LLM(**kw, enable_prefix_caching=False,
              kv_transfer_config=rv.transfer_config("file:" + str(store)))
    yield llm, AutoTokenizer.from_pretrained(MODEL)
    del llm
    shutil.rmtree(store, ignore_errors=True)


DOCS = ["The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was designed "
        "by the engineer Gustave Eiffel and completed in 1889 for the World's Fair.",
        "The Nile is a major river in northeastern Africa. It flows north for about 6,650 "
        "kilometres and empties into the Mediterranean Sea near Alexandria.",
        "Mount Fuji is the highest mountain in Japan at 3,776 metres. It is an active volcano "
        "that last erupted in 1707 and is a symbol of the country.",
        "The Great Wall of China is a series of fortifications built across northern China "
        "over many centuries to protect against raids from the steppe."]


def ask(llm, tok, order, question="How long is the Nile?", relokv_params=True):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prefix = enc("<|im_start|>system\nAnswer from the documents.<|im_end|>\n<|im_start|>user\n")
    spans = [enc("Document: " + DOCS[i] + "\n") for i in order]
    q = enc(f"Question: {question}<|im_end|>\n<|im_start|>assistant\n")
    ids, extra = rv.layout_prompt(prefix, spans, q)
    sp = SamplingParams(max_tokens=1, temperature=0, logprobs=8,
                        extra_args=extra if relokv_params else None)
    o = llm.generate(TokensPrompt(prompt_token_ids=ids), sp, use_tqdm=False)[0]
    lp = {k: v.logprob for k, v in o.outputs[0].logprobs[0].items()}
    return len(ids), len(ids) - len(q), o.num_cached_tokens or 0, lp, o.kv_transfer_params


def close(a, b):
    """The largest difference between two top-k logprob dicts over their shared tokens."""
    shared = set(a) & set(b)
    assert len(shared) >= 6
    return max(abs(a[t] - b[t]) for t in shared)


def test_vllm_exact_hits_give_vllms_own_logits(engines):
    llm, tok = engines
    n, q0, cached, first, _ = ask(llm, tok, [0, 1, 2], relokv_params=False)
    assert cached == 0  # no relokv parameters: vLLM's own, nothing reused
    _, _, cached, computed, _ = ask(llm, tok, [0, 1, 2])  # computed, then saved
    assert cached == 0
    assert close(first, computed) < 1e-4  # the same tokens, computed the same way
    _, _, cached, hit, _ = ask(llm, tok, [0, 1, 2])  # every block before the question: exact
    assert cached == q0 // 32 * 32
    # Keys stored unrotated and rotated back in float32: vLLM's own full prefill within float
    # rounding (measured 1e-5 on SmolLM2; vLLM promises no bit-exactness across batch shapes).
    assert close(first, hit) < 2e-3


def test_vllm_spans_come_back_relocated_in_any_order(engines):
    llm, tok = engines
    ask(llm, tok, [3, 1])  # Fuji and the Wall, the Nile: seen
    ask(llm, tok, [2, 0])
    n, q0, cached, reloc, _ = ask(llm, tok, [2, 3, 0, 1], question="Where is the Eiffel Tower?")
    assert cached == q0 // 32 * 32  # every span found where it now sits
    _, _, _, full, _ = ask(llm, tok, [2, 3, 0, 1], question="Where is the Eiffel Tower?",
                           relokv_params=False)
    # Naive reuse moves the logits (the spans were computed beside other neighbours); the
    # tokens both rank highest stay mostly the same (close() needs six of eight shared).
    assert close(reloc, full) > 1e-4


def test_vllm_a_bad_layout_is_an_error_in_the_output_not_a_crash(engines):
    llm, tok = engines
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    ids = tok.encode("Hello there, how are you today?", add_special_tokens=False)
    extra = {"kv_transfer_params": {"relokv": {"segments": [["prefix", 3]]}}}
    o = llm.generate(TokensPrompt(prompt_token_ids=ids),
                     SamplingParams(max_tokens=2, temperature=0, extra_args=extra),
                     use_tqdm=False)[0]
    assert len(o.outputs[0].token_ids) == 2
    assert "segments hold 3 tokens" in o.kv_transfer_params["relokv"]["error"]


def test_vllm_plain_prompts_are_cut_by_relokvs_span_finder(engines):
    """{"relokv": {"spans": "auto"}} (or transfer_config(spans="auto") for every request): a
    chat prompt with the passages pasted in its text, cut by relokv::find_spans as
    relokv_server --spans auto cuts it; its passages come back in another order."""
    llm, tok = engines
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def plain(order):
        text = ("Use the following pieces of context to answer the question.\n\n"
                + "\n\n".join(DOCS[i] for i in order) + "\n\nQuestion: How long is the Nile?")
        msgs = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": text}]
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok.encode(prompt, add_special_tokens=False)
        sp = SamplingParams(max_tokens=2, temperature=0,
                            extra_args={"kv_transfer_params": {"relokv": {"spans": "auto"}}})
        o = llm.generate(TokensPrompt(prompt_token_ids=ids), sp, use_tqdm=False)[0]
        return len(ids), o.num_cached_tokens or 0

    n, cached = plain([0, 1, 2])
    assert cached == 0
    n, cached = plain([2, 0, 1])  # the same passages reordered: relocated
    assert cached > 0.5 * n, (cached, n)


@pytest.fixture(scope="module")
def openai_server(tmp_path_factory):
    """vLLM's OpenAI server with relokv's connector (spans auto for plain prompts), on a free
    loopback port; stopped after the module's tests."""
    if not MODEL:
        pytest.skip("RELOKV_VLLM_MODEL is not set (./scripts/test --vllm converts SmolLM2)")
    import json
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    store = tmp_path_factory.mktemp("vllm-server-store")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path_factory.mktemp("vllm-server-log") / "server.log", "w")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL,
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m",
           "--dtype", "float32", "--max-model-len", "4096", "--enforce-eager",
           "--block-size", "32", "--seed", "0", "--no-enable-prefix-caching",
           "--enable-prompt-tokens-details", "--kv-transfer-config",
           json.dumps(rv.transfer_config("file:" + str(store), spans="auto"))]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                pytest.fail(f"vLLM's OpenAI server exited ({proc.returncode}): {log.name}")
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("vLLM's OpenAI server did not start in 300 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def post(url, path, body):
    import json
    import urllib.request
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def test_vllm_openai_server_takes_the_layout_in_kv_transfer_params(openai_server):
    """/v1/completions with the prompt as token ids and relokv's layout in the body's
    kv_transfer_params (vLLM passes it on to the connector): spans come back relocated; a bad
    layout is an error in the response's kv_transfer_params, not a failed request."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(MODEL)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prefix = enc("<|im_start|>system\nAnswer from the documents.<|im_end|>\n<|im_start|>user\n")
    q = enc("Question: How long is the Nile?<|im_end|>\n<|im_start|>assistant\n")

    def ask(order):
        docs = [enc("Document: " + DOCS[i] + "\n") for i in order]
        ids, extra = rv.layout_prompt(prefix, docs, q)
        r = post(openai_server, "/v1/completions",
                 {"model": "m", "prompt": ids, "max_tokens": 2, "temperature": 0,
                  "kv_transfer_params": extra["kv_transfer_params"]})
        return len(ids) - len(q), r["usage"]["prompt_tokens_details"]["cached_tokens"] or 0

    q0, cached = ask([0, 1, 2])
    assert cached == 0
    q0, cached = ask([2, 1, 0])
    assert cached == q0 // 32 * 32
    ids = enc("Hello there, how are you today?")
    r = post(openai_server, "/v1/completions",
             {"model": "m", "prompt": ids, "max_tokens": 2, "temperature": 0,
              "kv_transfer_params": {"relokv": {"segments": [["prefix", 3]]}}})
    assert "segments hold 3 tokens" in r["kv_transfer_params"]["relokv"]["error"]


def test_vllm_openai_server_reuses_plain_chat_prompts_with_spans_auto(openai_server):
    """transfer_config(spans="auto"): a chat request of any client, the passages with their
    titles pasted in the text (LangChain's stuff prompt, ten passages of the shipped 2Wiki
    sample, some titles repeated in quotes at the start of their text), reused when they come
    back in another order; no field of relokv's."""
    import json
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "data", "2wikimqa_dev_sample200.jsonl")) as f:
        rec = [json.loads(line) for line in f][13]
    titled = [(t, " ".join(x)) for t, x in rec["context"]]

    def chat(order):
        text = ("Use the following pieces of context to answer the question at the end. If you "
                "don't know the answer, just say that you don't know.\n\n"
                + "\n\n".join(f"{t}\n{x}" for t, x in (titled[i] for i in order))
                + "\n\nQuestion: " + rec["question"] + "\nHelpful Answer:")
        r = post(openai_server, "/v1/chat/completions",
                 {"model": "m", "messages": [{"role": "user", "content": text}],
                  "max_tokens": 2, "temperature": 0})
        u = r["usage"]
        return u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"] or 0

    n, cached = chat(list(range(len(titled))))
    assert cached == 0
    n, cached = chat([3, 7, 1, 9, 0, 5, 2, 8, 6, 4])
    assert cached > 0.9 * n, (cached, n)
