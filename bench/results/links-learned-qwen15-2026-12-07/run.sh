#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B's learned adapter (issue 66, item 6), as made on 2026-12-07, and its
# measurement. The prompt set is the 0.5B's (the same tokenizer: relokv_rag --export-workload
# writes the same file), 4 prompts a question, its validation thinned to every other prompt (28
# of 56, all 14 questions) and cut after the first 208 training prompts (52 questions), where
# the teacher was stopped to fit a session (~8 s a prompt here); 55 minutes of training.
#   run.sh [OUT.gguf]      (about 35 + 55 + 35 minutes on two cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${RELOKV_BUILD:-$root/build}
model=$("$root/scripts/get-model" qwen2.5-1.5b)
cache=${RELOKV_LINKS_CACHE:-$HOME/.cache/relokv/links/qwen2.5-1.5b}
out=${1:-$cache/qwen2.5-1.5b-learned.gguf}
mkdir -p "$cache"
[[ -s $cache/workload.json ]] ||
  "$build/examples/rag/relokv_rag" --model "$model" --requests 200 --export-workload "$cache/workload.json"
if [[ ! -s $cache/prompts.json ]]; then
  (cd "$root/tools/links" && python3 -m links.corpus --workload "$cache/workload.json" \
    --out "$cache/prompts-all.json" --per-question 4)
  python3 - "$cache/prompts-all.json" "$cache/prompts.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
v = [x for x in p["prompts"] if x["split"] == "validation"]
t = [x for x in p["prompts"] if x["split"] != "validation"]
p["prompts"] = v[::2] + t[:208]
json.dump(p, open(sys.argv[2], "w"))
PY
fi
"$build/examples/rag/relokv_teacher" --model "$model" --workload "$cache/workload.json" \
  --prompts "$cache/prompts.json" --out "$cache/teacher.jsonl"
python3 "$root/tools/links/distill.py" --model "$model" --workload "$cache/workload.json" \
  --prompts "$cache/prompts.json" --teacher "$cache/teacher.jsonl" --out "$out" \
  --depth kv --links 16 --header 0 --trailer 0 --epochs 1 --lr 0.003 --val 16 --eval-every 40 \
  --patience 3 --time-limit 3300 --seed 1
# In the engine: the 64 held-out questions, 12-token answers, beside naive reuse.
"$build/examples/rag/relokv_rag" --model "$model" --requests 64 --max-answer 12 \
  --variants naive --links "$out" --link-variants links --json learned.json --quiet
