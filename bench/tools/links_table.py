#!/usr/bin/env python3
"""The learned-adapter ablation's table from relokv_rag --json outputs (one per adapter, plus
one of the training-free baselines): per variant, work %, first-token KL, answer KL, greedy
agreement and teacher-forced agreement (each with its bootstrap 95% interval), F1 over full's.

    bench/tools/links_table.py LABEL=run.json [LABEL=run.json ...]

A run's `links` variant is labelled LABEL; its other variants (full, naive, EPIC, ...) are
listed once, from the first run that has them (the same questions in every run)."""
import json
import sys


def cell(v, key, fmt="{:.3f}"):
    x = v[key]
    if isinstance(x, dict):
        return f"{fmt.format(x['mean'])} [{fmt.format(x['lo'])}, {fmt.format(x['hi'])}]"
    return fmt.format(x)


def main():
    rows, seen = [], set()
    n = None
    for arg in sys.argv[1:]:
        label, path = arg.split("=", 1)
        with open(path) as f:
            j = json.load(f)
        n = n or j.get("requests")
        for v in j["variants"]:
            if v["key"] == "links":
                rows.append((label, v))
            elif v["key"] not in seen:
                seen.add(v["key"])
                rows.append((v["name"], v))
    print(f"| variant | work % | first-token KL | answer KL | greedy agreement % | "
          f"teacher-forced % | F1 / full's F1 |")
    print("|---|---|---|---|---|---|---|")
    for name, v in rows:
        print(f"| {name} | {v['work_pct']:.1f} | {cell(v, 'first_token_kl')} | "
              f"{cell(v, 'answer_kl')} | {cell(v, 'agreement_pct', '{:.1f}')} | "
              f"{cell(v, 'teacher_forced_pct', '{:.1f}')} | {cell(v, 'f1_over_full', '{:.2f}')} |")
    print(f"\n{n} held-out questions.")


if __name__ == "__main__":
    main()
