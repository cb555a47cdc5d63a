#!/usr/bin/env bash
# relokv_server EPIC and naive with and without the SmolLM2 link rows, spans first seen computed
# in context (default) or compiled alone (--compile-spans alone), ten passages, against its own
# full recompute (bench/serve_load.py; loopback; bounded).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
bin=$root/build/examples/server/relokv_server
model=$(ls ~/.cache/relokv/SmolLM2-135M-Instruct.Q4_1.gguf)
work=$(mktemp -d)
run() {  # name strategy parallel [server args] -- [load args]
  local name=$1 strat=$2 par=$3; shift 3
  local sargs=() largs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sargs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  largs=("$@")
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" --model "$model" --port "$port" --strategy "$strat" --parallel "$par" "${sargs[@]+"${sargs[@]}"}" > "$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
  python3 $root/bench/serve_load.py --url "http://127.0.0.1:$port/v1" --docs 10 --questions 8 --requests 24 --max-tokens 16 "${largs[@]}"
  kill $pid; wait $pid 2>/dev/null || true
}
run ref full 1 -- --users 1 --strategy full --write-reference "$work/ref.json" > /dev/null
run epic epic 4 -- --users 4 --reference "$work/ref.json" --prefix relokv_epic_
ad=$root/tools/links/adapters/smollm2-135m.gguf
run epic_links epic 4 --links $ad -- --users 4 --reference "$work/ref.json" --prefix relokv_epic_links_
run epic_links_alone epic 4 --links $ad --compile-spans alone -- --users 4 --reference "$work/ref.json" --prefix relokv_epic_links_alone_
run naive_links naive 4 --links $ad -- --users 4 --reference "$work/ref.json" --prefix relokv_naive_links_
run naive_links_alone naive 4 --links $ad --compile-spans alone -- --users 4 --reference "$work/ref.json" --prefix relokv_naive_links_alone_
run naive_alone naive 4 --compile-spans alone -- --users 4 --reference "$work/ref.json" --prefix relokv_naive_alone_
run naive naive 4 -- --users 4 --reference "$work/ref.json" --prefix relokv_naive_
rm -rf "$work"
