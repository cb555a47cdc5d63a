#!/usr/bin/env bash
# Issue 66, the ablation's missing cell: a deep header alone (8 rows before every span, compiled
# with it), no rows before the question, on the same short prompts as links-wrappers-2026-12-07.
set -x
cd /work/main
L=~/.cache/relokv/links/smollm2
M=~/.cache/relokv/SmolLM2-135M-Instruct.Q4_1.gguf
O=/work/runs/wrap2
common="--model $M --workload $L/workload.json --prompts $L/prompts.json --teacher $L/teacher.jsonl --depth kv --max-passages 4 --max-passage-tokens 192 --epochs 1.0 --val 24 --eval-every 100 --patience 3 --time-limit 5400"
python3 tools/links/distill.py $common --links 0 --header 8 --out $O/header8only.gguf > $O/header8only.log 2>&1
build/examples/rag/relokv_rag --model smollm2 --requests 48 --max-answer 16 --links $O/header8only.gguf \
    --link-variants links --variants naive --json $O/header8only-eval.json > $O/header8only-eval.txt 2>&1
echo done > $O/DONE
