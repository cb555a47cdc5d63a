#!/usr/bin/env python3
"""What a plan costs from Python against the same plan in C++ (relokv_report --filter python_).

Caches of 16-token blocks hold a system prompt and N spans of 128 tokens; each iteration plans
the spans in another order (relocated hits, EPIC's first 16 tokens recomputed) and releases the
request: Cache.plan + Cache.release from Python, and the same calls looped in C++
(relokv._relokv._bench_plan), alternated in one process, the median of the repetitions.
Prints, one `name value` line each:
  python_plan_overhead_ns_per_block   (Python - C++) / blocks, at the largest request
  python_plan_over_cpp                Python / C++, at the largest request
  python_plan_cpp_ns_per_block        C++, at the largest request
  python_plan_constant_ns             the least c with Python <= 1.1 x C++ + c at every size
Usage: PYTHONPATH=<build>/python python3 bench/python_plan_overhead.py [--reps N] [--verbose]
"""

import argparse
import statistics
import sys
import time

import relokv
from relokv import _relokv

BS = 16


def layouts(n_spans):
    system = list(range(1, 33))
    spans = [list(range(1000 * (i + 1), 1000 * (i + 1) + 128)) for i in range(n_spans)]
    question = [7, 8, 9, 10, 11, 12, 13, 14]

    def build(order):
        b = relokv.LayoutBuilder(BS).prefix(system)
        for i in order:
            b.span(spans[i])
        return b.question(question).build()

    return build(range(n_spans)), build(reversed(range(n_spans)))


def measure(n_spans, reps, iters):
    first, reordered = layouts(n_spans)
    cache = relokv.Cache(8 * (n_spans + 4) * 4, BS)
    p = cache.plan(first)
    cache.commit(p)
    cache.release(p)
    epic = relokv.Strategy("epic")
    plan, release = cache.plan, cache.release
    py, cpp = [], []
    for _ in range(reps):
        cpp.append(_relokv._bench_plan(cache, reordered, epic, iters))
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            release(plan(reordered, epic))
        py.append((time.perf_counter_ns() - t0) / iters)
    check = cache.plan(reordered, epic)
    assert check.exact_hits + check.relocated_hits == check.blocks.__len__() - 1, check  # all reused but the question
    cache.release(check)
    return reordered.num_blocks, statistics.median(py), statistics.median(cpp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    rows = []
    for n in (1, 4, 16, 64):
        blocks, py, cpp = measure(n, a.reps, max(20, 2000 // n))
        rows.append((blocks, py, cpp))
        if a.verbose:
            print(f"# {n:3d} spans, {blocks:4d} blocks: Python {py:9.0f} ns, C++ {cpp:9.0f} ns, "
                  f"ratio {py / cpp:.3f}, overhead {(py - cpp) / blocks:.1f} ns/block", file=sys.stderr)
    blocks, py, cpp = rows[-1]
    print(f"python_plan_overhead_ns_per_block {(py - cpp) / blocks:.3g}")
    print(f"python_plan_over_cpp {py / cpp:.3g}")
    print(f"python_plan_cpp_ns_per_block {cpp / blocks:.3g}")
    print(f"python_plan_constant_ns {max(0.0, max(p - 1.1 * c for _, p, c in rows)):.3g}")


if __name__ == "__main__":
    main()
