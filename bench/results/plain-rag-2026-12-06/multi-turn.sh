# Two-turn conversations (bench/rag_workload.py, ten passages, 16 conversations),
# 4 users, the project's client, relokv_server (epic, --spans auto) then llama-server (--cache-reuse 256).
set -e
root=$(cd "$(dirname "$0")/../../.." && pwd)
python3 $root/bench/rag_workload.py --docs 10 --requests 16 --turns 2 --questions 40 --out /tmp/mt.json
model=$(ls ~/.cache/relokv/SmolLM2-135M-Instruct.Q4_1.gguf)
llama=$($root/scripts/get-llama-server)
port=18411
$root/build/examples/server/relokv_server --model $model --port $port --strategy epic --parallel 4 > /tmp/mt_r.log 2>&1 & pid=$!
for i in $(seq 1 100); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.2; done
python3 $root/bench/serve_load.py --url http://127.0.0.1:$port/v1 --workload /tmp/mt.json --users 4 --prefix relokv_mt_u4_
kill $pid; wait $pid 2>/dev/null || true
port=18412
$llama -m $model --host 127.0.0.1 --port $port -t 2 -np 4 -c 16384 --cache-reuse 256 > /tmp/mt_l.log 2>&1 & pid=$!
for i in $(seq 1 300); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.2; done
python3 $root/bench/serve_load.py --url http://127.0.0.1:$port/v1 --kind llama --workload /tmp/mt.json --users 4 --prefix llama_server_mt_u4_
kill $pid; wait $pid 2>/dev/null || true
