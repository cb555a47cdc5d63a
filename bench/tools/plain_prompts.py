#!/usr/bin/env python3
"""Writes bench/plain_prompt_reuse's requests as JSON lines for relokv_span_reuse_offline: per
format of bench/serve_load.py's suite, each request's user message ({"fmt", "text"}), and the
same requests in `documents` ({"fmt": "documents", "docs": [...], "text": question}).
    bench/tools/plain_prompts.py [--requests 24] [--questions 8] > prompts.jsonl"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import serve_load  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--requests", type=int, default=24)
ap.add_argument("--questions", type=int, default=8)
ap.add_argument("--zipf", type=float, default=1.1)  # serve_load's defaults
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--sample", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "..", "..", "data", "2wikimqa_dev_sample200.jsonl"))
a = ap.parse_args()
reqs = serve_load.make_requests(serve_load.load_sample(a.sample, a.questions), a.requests,
                                a.zipf, a.seed)
for fmt in serve_load.SUITE:
    for i, r in enumerate(reqs):
        print(json.dumps({"fmt": fmt, "text": serve_load.render(serve_load.SUITE[fmt], r["docs"],
                                                                r["question"], i + 1)}))
for r in reqs:
    print(json.dumps({"fmt": "documents", "text": "Question: " + r["question"],
                      "docs": [f"Document: {d['title']}\n{d['text']}\n" for d in r["docs"]]}))
