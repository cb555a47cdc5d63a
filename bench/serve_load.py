#!/usr/bin/env python3
"""Concurrent load on an OpenAI-compatible chat server over the 2WikiMultihopQA sample.

N users each send requests one after another (streaming, greedy); a request is a question of
the sample drawn with Zipf popularity, its passages in a fresh random order. Against
relokv_server the passages go in `documents` (relocatable spans); against llama-server
(--kind llama) the same text is inlined in the user message, which gives the same tokens
under the model's ChatML template. Prints `name value` lines (bench/results/README.md):

  requests, failed, ttft_p50_ms, ttft_p95_ms, requests_per_s, output_tokens_per_s,
  prompt_tokens_per_request, computed_tokens_per_request, and with --reference FILE:
  agreement (share of answers equal to the reference's answer to the same request) and differ.

--write-reference FILE answers every request alone, one at a time, and saves the answers.
Traffic goes to the URL given (loopback in the project's scripts); bounded in count and time.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import time

import threading
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = "Answer the question from the documents, in a few words."


def load_sample(path, questions):
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
            if len(out) == questions:
                break
    return out


def make_requests(sample, n, zipf, seed, keep=0):
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** zipf for i in range(len(sample))]
    reqs = []
    for i in range(n):
        q = rng.choices(range(len(sample)), weights)[0]
        ctx = list(sample[q]["context"])
        if keep:
            ctx = ctx[:keep]
        rng.shuffle(ctx)
        docs = [{"title": t, "text": " ".join(s)} for t, s in ctx]
        reqs.append({"key": f"{q}:{i}", "question": sample[q]["question"], "docs": docs})
    return reqs


# The prompts RAG clients send with the passages in the message text (--format): the format
# suite of tests/support/prompt_formats.hpp (the same specs): what the frameworks send
# (LangChain's "stuff" prompt, LlamaIndex's QA template, Haystack's indented context), labels
# that follow the order (numbered sources, XML with an index, "Document n:"), JSON arrays,
# titles, CRLF, an opening sentence that changes per request, and passages in an earlier turn.
def _fmt(intro="", label="", indent="", close="", sep="\n\n", outro="\n\nQuestion: ",
         titles=False, json_array=False, crlf=False):
    return dict(intro=intro, label=label, indent=indent, close=close, sep=sep, outro=outro,
                titles=titles, json_array=json_array, crlf=crlf)


SUITE = {
    "langchain": _fmt(intro="Use the following pieces of context to answer the question at the "
                      "end. If you don't know the answer, just say that you don't know, don't "
                      "try to make up an answer.\n\n", outro="\n\nQuestion: ", titles=True),
    "llamaindex": _fmt(intro="Context information is below.\n---------------------\n",
                       outro="\n---------------------\nGiven the context information and not "
                       "prior knowledge, answer the query.\nQuery: ", titles=True),
    "blank-lines": _fmt(titles=True, outro="\n\n"),
    "markdown": _fmt(intro="## Sources\n", label="- ", sep="\n"),
    "one-a-line": _fmt(intro="Answer using these passages.\n", sep="\n", outro="\n"),
    "haystack": _fmt(intro="Given the context please answer the question.\nContext:\n",
                     indent="    ", sep="\n", outro="\nQuestion: "),
    "xml": _fmt(intro="<documents>\n", label='<document index="%d">\n', close="\n</document>",
                sep="\n", outro="\n</documents>\n\n"),
    "xml-inline": _fmt(intro="Documents: ", label='<doc id="%d">', close="</doc>", sep=" ",
                       outro="\nQuestion: "),
    "numbered": _fmt(intro="Cite the sources you use as [n].\n\n", label="[%d] ", sep="\n"),
    "document-n": _fmt(label="Document %d: "),
    "json": _fmt(intro="Context (JSON): ", outro="\nQuestion: ", json_array=True),
    "titled": _fmt(intro="Read the articles below.\n\n", titles=True),
    "crlf": _fmt(intro="Sources:\n", label="%d. ", sep="\n", crlf=True),
    "changing-intro": _fmt(intro="Request %d: answer from the passages below only.\n"),
}


def render(f, docs, question, request):
    """The user message of format f: docs [{title, text}] in order, then the question."""
    out = f["intro"].replace("%d", str(request))
    # Each passage as a document loader gives it, its title on a line above its text: the
    # same words `documents` sends (the share compares like with like).
    texts = [d["title"] + "\n" + d["text"] for d in docs]
    if f["json_array"]:
        out += json.dumps(texts)
    else:
        out += f["sep"].join(f["indent"] + f["label"].replace("%d", str(i + 1))
                             + t.replace("\n", "\n" + f["indent"])
                             + f["close"].replace("%d", str(i + 1)) for i, t in enumerate(texts))
    out += f["outro"] + question
    return out.replace("\n", "\r\n") if f["crlf"] else out


FORMATS = sorted(list(SUITE) + ["multi-turn"])


def body(req, kind, max_tokens, strategy, cache=True, fmt="documents"):
    if "messages" in req:
        # A conversation's turn (--workload): the messages as they are, on either server.
        b = {"messages": req["messages"]}
        if kind == "relokv" and strategy:
            b["relokv"] = {"strategy": strategy}
        if kind != "relokv":
            b["cache_prompt"] = cache
        max_tokens = req.get("max_tokens", max_tokens)
    elif kind == "relokv" and fmt in FORMATS:
        # Plain prompt: no field of relokv's (relokv_server --spans auto finds the passages).
        n = int(req["key"].split(":")[1]) + 1
        if fmt == "multi-turn":
            # The passages came in an earlier turn; this request asks its question after it.
            first = render(SUITE["blank-lines"], req["docs"], "What are these about?", n)
            msgs = [{"role": "user", "content": first},
                    {"role": "assistant", "content": "They are the sources you gave."},
                    {"role": "user", "content": req["question"]}]
        else:
            msgs = [{"role": "user", "content": render(SUITE[fmt], req["docs"], req["question"], n)}]
        b = {"messages": [{"role": "system", "content": SYSTEM}] + msgs}
        if strategy:
            b["relokv"] = {"strategy": strategy}
    elif kind == "relokv":
        b = {"messages": [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": req["question"]}],
             "documents": req["docs"]}
        if strategy:
            b["relokv"] = {"strategy": strategy}
    else:
        # The text relokv_server builds from `documents`: each "Document: TITLE\nTEXT\n", then
        # "Question: ..." (api.cpp), inside the same ChatML user turn.
        text = "".join(f"Document: {d['title']}\n{d['text']}\n" for d in req["docs"])
        b = {"messages": [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": text + "Question: " + req["question"]}],
             "cache_prompt": cache}
    b.update({"max_tokens": max_tokens, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}})
    return b


def one(url, req, args):
    """One streamed request on its own connection (http.client: no dependency)."""
    u = urllib.parse.urlsplit(url)
    t0 = time.perf_counter()
    ttft = None
    text, usage, timings, ok = [], None, None, False
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=args.timeout)
    try:
        conn.request("POST", u.path + "/chat/completions",
                     json.dumps(body(req, args.kind, args.max_tokens, args.strategy,
                                     not args.no_cache, args.format)),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            return {"ok": False, "status": r.status}
        for raw in r:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                ok = True
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            if ev.get("timings"):
                timings = ev["timings"]
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        return {"ok": False, "status": str(e)}
    finally:
        conn.close()
    if not ok:
        return {"ok": False, "status": "no [DONE]"}
    prompt = (usage or {}).get("prompt_tokens", 0)
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    computed = prompt - cached
    if timings and "prompt_n" in timings:  # llama-server: the tokens it evaluated
        computed = timings["prompt_n"]
        if not prompt:
            prompt = timings["prompt_n"] + timings.get("cache_n", 0)
    return {"ok": True, "ttft": ttft if ttft is not None else time.perf_counter() - t0,
            "text": "".join(text), "completion": (usage or {}).get("completion_tokens", 0),
            "prompt": prompt, "computed": computed, "seconds": time.perf_counter() - t0}


def run(args, reqs):
    """args.users threads, each sending the next request of a shared queue when its last one
    is answered; stops taking requests after args.deadline seconds."""
    results = {}
    lock = threading.Lock()
    queue = list(reqs)
    t0 = time.perf_counter()

    def user():
        while time.perf_counter() - t0 < args.deadline:
            with lock:
                if not queue:
                    return
                req = queue.pop(0)
            if "turns" not in req:
                r = one(args.url, req, args)
                with lock:
                    results[req["key"]] = r
                continue
            # A conversation: its turns one after another, each with the answers so far.
            messages = [{"role": "system", "content": SYSTEM}]
            for t, text in enumerate(req["turns"]):
                messages.append({"role": "user", "content": text})
                r = one(args.url, {"messages": list(messages),
                                   "max_tokens": req.get("max_tokens", args.max_tokens)}, args)
                with lock:
                    results[f"{req['key']}#{t}"] = r
                if not r["ok"]:
                    break
                messages.append({"role": "assistant", "content": r["text"]})

    threads = [threading.Thread(target=user) for _ in range(args.users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="the server's /v1 base")
    ap.add_argument("--kind", choices=("relokv", "llama"), default="relokv")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--questions", type=int, default=40, help="distinct questions drawn from")
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--docs", type=int, default=0, help="passages per request (0: all ten)")
    ap.add_argument("--no-cache", action="store_true",
                    help="llama-server: cache_prompt false (its full recompute)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--strategy", default=None, help="relokv.strategy for every request")
    ap.add_argument("--workload", help="conversations from bench/rag_workload.py --out, replayed "
                    "as plain prompts instead of the sample's requests")
    ap.add_argument("--format", default="documents", choices=["documents"] + list(FORMATS),
                    help="relokv: the passages in `documents` (default) or in the message text "
                         "as a RAG template puts them")
    ap.add_argument("--sample", default=os.path.join(ROOT, "data", "2wikimqa_dev_sample200.jsonl"))
    ap.add_argument("--reference", help="answers to compare with (from --write-reference)")
    ap.add_argument("--write-reference", help="answer each request alone and save the answers")
    ap.add_argument("--prefix", default="", help="prefix of every printed name")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per request")
    ap.add_argument("--deadline", type=float, default=3600, help="seconds for the whole run")
    args = ap.parse_args()
    if args.workload:
        with open(args.workload) as f:
            reqs = json.load(f)
    else:
        reqs = make_requests(load_sample(args.sample, args.questions), args.requests, args.zipf,
                             args.seed, args.docs)
    if args.write_reference:
        args.users = 1
    results, wall = run(args, reqs)
    ok = [r for r in results.values() if r["ok"]]
    failed = len(results) - len(ok)
    if args.write_reference:
        with open(args.write_reference, "w") as f:
            json.dump({k: r.get("text") for k, r in results.items()}, f)
    p = args.prefix
    out = {"requests": len(results), "failed": failed}
    ttft = [r["ttft"] * 1000 for r in ok]
    out.update({
        "ttft_p50_ms": pct(ttft, 50), "ttft_p95_ms": pct(ttft, 95),
        "requests_per_s": len(ok) / wall,
        "output_tokens_per_s": sum(r["completion"] for r in ok) / wall,
        "prompt_tokens_per_request": statistics.mean(r["prompt"] for r in ok) if ok else 0,
        "computed_tokens_per_request": statistics.mean(r["computed"] for r in ok) if ok else 0,
        "reused_tokens_per_request":
            statistics.mean(r["prompt"] - r["computed"] for r in ok) if ok else 0,
    })
    if args.reference:
        ref = json.load(open(args.reference))
        same = [results[k]["text"] == ref.get(k) for k in results if results[k]["ok"]]
        out["agreement"] = sum(same) / max(len(same), 1)
        out["differ"] = len(same) - sum(same)
    for k, v in out.items():
        print(f"{p}{k} {v:.6g}" if isinstance(v, float) else f"{p}{k} {v}")
    bad = [r for r in results.values() if not r["ok"]]
    if bad:
        print("# failures: " + ", ".join(str(r["status"]) for r in bad[:5]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
