#!/usr/bin/env bash
# relokv_server with the shipped learned adapter (tools/links/adapters/smollm2-135m-learned.gguf:
# deep rows before the question) beside naive reuse and EPIC on bench/serve_rag's workload: plain
# prompts (LangChain's "stuff" prompt, --spans auto finds the passages), ten passages, 64-token
# answers ($MAX_TOKENS: 16 as the engine's figures), 32 conversations over the sample's first 40
# questions (held out: never trained or validated on), 16 users, each against the server's own
# full recompute answering alone (bench/serve_load.py --workload; loopback; bounded). Spans
# first seen computed in context (the default) or compiled alone (--compile-spans alone, as the
# rows were trained).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
bin=${RELOKV_SERVER_BIN:-$root/build/examples/server/relokv_server}
model=$("$root/scripts/get-model" smollm2)
ad=$root/tools/links/adapters/smollm2-135m-learned.gguf
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$root/bench/rag_workload.py" --docs 10 --requests 32 --questions 40 \
  --max-tokens "${MAX_TOKENS:-64}" \
  --out "$work/w.json" >/dev/null
load=(--workload "$work/w.json")
run() {  # name strategy parallel [server args] -- [load args]
  local name=$1 strat=$2 par=$3; shift 3
  local sargs=() largs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sargs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  largs=("$@")
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" --model "$model" --host 127.0.0.1 --port "$port" --strategy "$strat" --parallel "$par" \
    --spans auto "${sargs[@]+"${sargs[@]}"}" > "$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
  python3 "$root/bench/serve_load.py" --url "http://127.0.0.1:$port/v1" "${load[@]}" "${largs[@]}" || true
  kill $pid; wait $pid 2>/dev/null || true
}
run ref full 1 -- --users 1 --strategy full --write-reference "$work/ref.json" > /dev/null
for v in "naive naive" "naive_alone naive --compile-spans alone" \
         "learned naive --links $ad" "learned_alone naive --links $ad --compile-spans alone" \
         "epic epic" "epic_learned_alone epic --links $ad --compile-spans alone"; do
  set -- $v
  name=$1; shift
  strat=$1; shift
  run "$name" "$strat" 16 "$@" -- --users 16 --reference "$work/ref.json" --prefix "server_links_${name}_" |
    grep -E "_(agreement|requests_per_s|ttft_p50_ms|computed_tokens_per_request|failed) " || true
done
