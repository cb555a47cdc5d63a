#!/usr/bin/env bash
# Issue 66, the ablation's correction-only cell: a deep low-rank correction of each span's own
# K/V (rank 8, the last 8 of SmolLM2's 30 layers) trained alone, with no rows before the
# question: nothing is added to a request (2.6% of the work, naive reuse's), the correction is
# applied when the span is compiled. The shipped recipe's data (500 training prompts, 48
# validation, lr 0.02, validation every 100 steps), stopped by a time limit of 3,600 s.
# Then the 48 held-out questions. The shipped adapter (rows before the question) and naive
# reuse were measured the same way on the same machine in session 9
# (../links-lowrank-2026-12-07/shipped-eval-table.txt); this run's naive row repeats that one.
set -x
cd "$(dirname "$0")/../../.."
O=${O:-/work/runs/alone}
mkdir -p "$O"
tools/links/make-learned smollm2 "$O/alone8.gguf" --depth kv --links 0 --lowrank 8 \
  --lowrank-layers 8 --max-train 500 --epochs 1.2 --lr 0.02 --val 48 --eval-every 100 \
  --patience 3 --time-limit 3600 > "$O/alone8.log" 2>&1
build/examples/rag/relokv_rag --model smollm2 --requests 48 --max-answer 16 --links "$O/alone8.gguf" \
  --link-variants links --variants naive --json "$O/alone8-eval.json" > "$O/alone8-eval.txt" 2>&1
echo done > "$O/DONE"
# The <= 20% goal: the shipped rows under question-driven recompute (12% of the span tokens
# chosen by the question's attention), beside question-driven alone, the same 48 questions.
build/examples/rag/relokv_rag --model smollm2 --requests 48 --max-answer 16 \
  --links tools/links/adapters/smollm2-135m-learned.gguf --link-variants links+question \
  --variants question --json "$O/question-eval.json" > "$O/question-eval.txt" 2>&1
