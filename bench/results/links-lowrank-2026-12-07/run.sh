#!/usr/bin/env bash
# Issue 66: the deep low-rank correction (rank 8, the last 8 of SmolLM2's 30 layers) with the
# shipped recipe's 16 deep rows before the question (500 prompts, 600 steps, lr 0.02), then
# measured on the 48 held-out questions as every round.
set -x
cd /work/main
L=~/.cache/relokv/links/smollm2
M=~/.cache/relokv/SmolLM2-135M-Instruct.Q4_1.gguf
O=/work/runs/lowrank
python3 tools/links/distill.py --model $M --workload $L/workload.json --prompts $L/prompts.json \
  --teacher $L/teacher.jsonl --depth kv --links 16 --lowrank 8 --lowrank-layers 8 \
  --max-train 500 --epochs 0.8 --lr 0.02 --val 48 --eval-every 100 --patience 3 \
  --time-limit 5400 --out $O/lowrank8.gguf > $O/lowrank8.log 2>&1
build/examples/rag/relokv_rag --model smollm2 --requests 48 --max-answer 16 --links $O/lowrank8.gguf \
    --link-variants links --variants naive --json $O/lowrank8-eval.json > $O/lowrank8-eval.txt 2>&1
echo done > $O/DONE
