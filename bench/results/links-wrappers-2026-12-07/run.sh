#!/usr/bin/env bash
# Issue 66 round 4: a deep header (8 rows before every span, compiled with it) with 16 deep rows
# before the question, trained on short prompts (<= 4 passages of <= 192 tokens), against the
# same 16 deep rows alone on the same short prompts; both measured on the 48 held-out questions.
set -x
cd /work/main
L=~/.cache/relokv/links/smollm2
M=~/.cache/relokv/SmolLM2-135M-Instruct.Q4_1.gguf
O=/work/runs/wrap
common="--model $M --workload $L/workload.json --prompts $L/prompts.json --teacher $L/teacher.jsonl --depth kv --max-passages 4 --max-passage-tokens 192 --epochs 1.0 --val 24 --eval-every 100 --patience 3 --time-limit 5400"
python3 tools/links/distill.py $common --links 16 --header 8 --out $O/header8.gguf > $O/header8.log 2>&1
python3 tools/links/distill.py $common --links 16 --out $O/short16.gguf > $O/short16.log 2>&1
for a in header8 short16; do
  build/examples/rag/relokv_rag --model smollm2 --requests 48 --max-answer 16 --links $O/$a.gguf \
    --link-variants links --variants naive --json $O/$a-eval.json > $O/$a-eval.txt 2>&1
done
echo done > $O/DONE
