#!/usr/bin/env python3
"""relokv inside vLLM beside vLLM's own prefix caching, on the ten-passage RAG workload of
bench/serve_load.py (2WikiMultihopQA sample, Zipf-popular questions, passages reordered every
time), one user, the same model, threads and requests. Three runs, each in its own process:

  full     vLLM, no prefix caching, no connector: the reference answers
  prefix   vLLM with its prefix caching (what vLLM reuses today)
  relokv   vLLM with prefix caching and relokv's connector (naive reuse: spans relocated)

Each request is the `documents` layout relokv's server builds (the system turn, then
"Document: TITLE\\nTEXT\\n" per passage, then "Question: ..."), tokenized piece by piece, so
relokv knows its spans (relokv.vllm.layout_prompt), offline (vLLM's LLM class), one user.
Prints `name value` lines (bench/vllm_serve gives the vllm_relokv_* headline figures: vLLM's
OpenAI server, plain prompts, aiperf):
  vllm_layout_ttft_p50_over_prefix, vllm_layout_ttft_p95_over_prefix
  vllm_layout_throughput_over_prefix   requests/s, one user
  vllm_layout_computed_over_prefix     prompt tokens computed
  vllm_layout_agreement, vllm_layout_prefix_agreement   whole greedy answers equal to full's
  vllm_layout_engine_agreement   relokv's own engine, the same requests and variant (--gguf)
Run with the vLLM environment's python and relokv's build on PYTHONPATH:
  PYTHONPATH=build/python $(scripts/get-vllm) bench/vllm_rag.py --model HF_DIR
(HF_DIR: tools/vllm/gguf_to_safetensors.py's output)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_load  # noqa: E402

SYSTEM = serve_load.SYSTEM


def requests_of(args, tok):
    sample = serve_load.load_sample(args.sample, args.questions)
    reqs = serve_load.make_requests(sample, args.requests, args.zipf, args.seed, keep=args.docs)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    opening = tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": "\x00"}],
                                      tokenize=False, add_generation_prompt=True)
    head, tail = opening.split("\x00")
    out = []
    for r in reqs:
        spans = [enc(f"Document: {d['title']}\n{d['text']}\n") for d in r["docs"]]
        out.append((enc(head), spans, enc("Question: " + r["question"] + tail)))
    return out


def run_mode(args):
    """One mode's run, in this process: prints one JSON line of per-request results."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    import relokv.vllm as rv
    tok = AutoTokenizer.from_pretrained(args.model)
    reqs = requests_of(args, tok)
    kw = dict(model=args.model, dtype=args.dtype, max_model_len=4096, enforce_eager=True,
              skip_tokenizer_init=True, block_size=32, disable_log_stats=False,
              enable_prefix_caching=args.mode != "full", seed=0)
    if args.mode == "relokv":
        kw["kv_transfer_config"] = rv.transfer_config("file:" + args.store)
    llm = LLM(**kw)
    eos = tok.eos_token_id
    out = []
    t_all = time.perf_counter()
    for prefix, spans, question in reqs:
        ids, extra = rv.layout_prompt(prefix, spans, question)
        sp = SamplingParams(max_tokens=args.max_tokens, temperature=0,
                            stop_token_ids=[eos] if eos is not None else None,
                            extra_args=extra if args.mode == "relokv" else None)
        t0 = time.perf_counter()
        o = llm.generate(TokensPrompt(prompt_token_ids=ids), sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        m = o.metrics
        ttft = getattr(m, "first_token_latency", 0.0) if m is not None else 0.0
        out.append({"prompt": len(ids), "cached": o.num_cached_tokens or 0,
                    "ttft": ttft if ttft > 0 else wall, "wall": wall,
                    "answer": list(o.outputs[0].token_ids)})
    total = time.perf_counter() - t_all
    print("RESULT " + json.dumps({"mode": args.mode, "seconds": total, "requests": out}),
          flush=True)


def run_engine(args):
    """relokv's own engine on the same requests and variant (naive reuse) against its own full
    recompute: the agreement relokv inside vLLM is compared with."""
    import relokv
    sample = serve_load.load_sample(args.sample, args.questions)
    reqs = serve_load.make_requests(sample, args.requests, args.zipf, args.seed, keep=args.docs)
    eng = relokv.Engine(args.gguf, num_blocks=8192)
    same = 0
    for r in reqs:
        docs = [f"Document: {d['title']}\n{d['text']}\n" for d in r["docs"]]
        layout = eng.layout(docs, "Question: " + r["question"], system=SYSTEM)
        full = eng.generate(eng.prefill(layout, "full"), args.max_tokens)
        eng.end(commit=False)
        naive = eng.generate(eng.prefill(layout, "naive"), args.max_tokens)
        eng.end(commit=True)
        same += list(full) == list(naive)
    print("RESULT " + json.dumps({"mode": "engine", "agreement": same / len(reqs)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face directory (safetensors)")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sample", default=os.path.join(HERE, "..", "data",
                                                      "2wikimqa_dev_sample200.jsonl"))
    ap.add_argument("--gguf", help="the same model's GGUF: relokv's own engine's agreement "
                    "with the same variant beside it (vllm_layout_engine_agreement)")
    ap.add_argument("--mode", choices=["full", "prefix", "relokv", "engine"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--raw", help="write each mode's per-request results here (JSON)")
    args = ap.parse_args()
    if args.mode == "engine":
        return run_engine(args)
    if args.mode:
        return run_mode(args)
    results = {}
    store = tempfile.mkdtemp(prefix="relokv-vllm-")
    try:
        for mode in ("full", "prefix", "relokv") + (("engine",) if args.gguf else ()):
            cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--store", store]
            for k in ("model", "requests", "questions", "docs", "zipf", "seed", "max_tokens",
                      "dtype", "sample") + (("gguf",) if args.gguf else ()):
                cmd += ["--" + k.replace("_", "-"), str(getattr(args, k))]
            p = subprocess.run(cmd, capture_output=True, text=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                sys.stderr.write(p.stderr[-4000:])
                sys.exit(f"vllm_rag: the {mode} run failed ({p.returncode})")
            results[mode] = json.loads(line[0][7:])
    finally:
        shutil.rmtree(store, ignore_errors=True)
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(results, f)
    full = results["full"]["requests"]

    def summary(mode):
        r = results[mode]["requests"]
        ttft = sorted(x["ttft"] for x in r)
        return {"ttft_p50": statistics.median(ttft), "ttft_p95": ttft[int(0.95 * (len(ttft) - 1))],
                "rps": len(r) / results[mode]["seconds"],
                "computed": sum(x["prompt"] - x["cached"] for x in r) / len(r),
                "prompt": sum(x["prompt"] for x in r) / len(r),
                "agreement": sum(a["answer"] == b["answer"] for a, b in zip(r, full)) / len(r)}
    engine = results.pop("engine", None)
    s = {m: summary(m) for m in results}
    for m, v in s.items():
        for k, x in v.items():
            print(f"# vllm_layout_{m}_{k} {x:.4g}")
    p, r = s["prefix"], s["relokv"]
    print(f"vllm_layout_ttft_p50_over_prefix {r['ttft_p50'] / p['ttft_p50']:.3f}")
    print(f"vllm_layout_ttft_p95_over_prefix {r['ttft_p95'] / p['ttft_p95']:.3f}")
    print(f"vllm_layout_throughput_over_prefix {r['rps'] / p['rps']:.3f}")
    print(f"vllm_layout_computed_over_prefix {r['computed'] / p['computed']:.3f}")
    print(f"vllm_layout_agreement {r['agreement']:.3f}")
    print(f"vllm_layout_prefix_agreement {p['agreement']:.3f}")
    if engine is not None:
        print(f"vllm_layout_engine_agreement {engine['agreement']:.3f}")
        print(f"vllm_layout_agreement_minus_engine {r['agreement'] - engine['agreement']:.3f}")


if __name__ == "__main__":
    main()
