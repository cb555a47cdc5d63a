#!/usr/bin/env python3
"""An aiperf run's figures as `name value` lines (bench/serve_rag, bench/vllm_serve):
    aiperf_lines.py profile_export_aiperf.json PREFIX
requests, TTFT p50/p95, inter-token latency p50, output tokens/s, requests/s, goodput (when the
run measured it), prompt and reused tokens a request, errors."""
import json
import sys


def main():
    d, name = json.load(open(sys.argv[1])), sys.argv[2]

    def v(k, stat="avg"):
        return (d.get(k) or {}).get(stat, float("nan"))
    lines = {
        "requests": v("request_count"), "ttft_p50_ms": v("time_to_first_token", "p50"),
        "ttft_p95_ms": v("time_to_first_token", "p95"),
        "itl_p50_ms": v("inter_token_latency", "p50"),
        "output_tokens_per_s": v("output_token_throughput"),
        "requests_per_s": v("request_throughput"),
    }
    if "goodput" in d:
        lines["goodput_requests_per_s"] = v("goodput")
    lines.update({
        "prompt_tokens_per_request": v("usage_prompt_tokens"),
        "reused_tokens_per_request": v("usage_prompt_cache_read_tokens"),
        "errors": sum(e.get("count", 0) for e in d.get("error_summary") or []),
    })
    for k, x in lines.items():
        print(f"{name}_{k} {x:.6g}")


if __name__ == "__main__":
    main()
