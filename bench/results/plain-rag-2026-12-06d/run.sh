#!/bin/bash
# usage: run16.sh users docs extra-server-args...
set -u
root=/work/main; which=$1; u=$2; d=$3; shift 3
M=$($root/scripts/get-model smollm2)
w=/tmp/prof/w; mkdir -p $w
T=${TURNS:-1}; C=${CONVS:-64}; [ -f $w/w${d}t${T}c$C.jsonl ] || python3 $root/bench/rag_workload.py --docs $d --requests $C --turns $T --max-tokens 64 --out $w/w${d}t${T}c$C.json --aiperf $w/w${d}t${T}c$C.jsonl
[ -d $w/tokenizer ] || python3 $root/bench/tools/gguf_tokenizer.py $M $w/tokenizer
port=18090
if [ $which = relokv ]; then ${RELOKV_SERVER_BIN:-$root/build/examples/server/relokv_server} --model $M --host 127.0.0.1 --port $port --strategy epic --parallel $u --spans auto "$@" > $w/srv.log 2>&1 &
else $($root/scripts/get-llama-server) -m $M --host 127.0.0.1 --port $port -t 2 -np $u -c $(( u * 4096 )) --cache-reuse 256 > $w/srv.log 2>&1 & fi
pid=$!
for i in $(seq 300); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.2; done
s0=$(awk '{print $14+$15}' /proc/$pid/stat)
t0=$(date +%s.%N)
out=$w/aiperf_${u}_$$
/usr/bin/time -f "aiperf cpu user %U sys %S wall %e" aiperf profile --model relokv --url "http://127.0.0.1:$port" --endpoint-type chat --streaming \
    --input-file $w/w${d}t${T}c$C.jsonl --custom-dataset-type $([ $T = 1 ] && echo single_turn || echo multi_turn) --concurrency $u --request-rate 100 --arrival-pattern constant \
    --request-count ${N:-32} --tokenizer $w/tokenizer \
    --extra-inputs temperature:0 --use-server-token-count --ui-type none --no-server-metrics \
    --workers-max 1 --record-processor-service-count 1 \
    --goodput "time_to_first_token:2000 inter_token_latency:200" \
    --output-artifact-dir $out > $out.log 2>&1
tail -1 $out.log
s1=$(awk '{print $14+$15}' /proc/$pid/stat); t1=$(date +%s.%N)
echo "server cpu s: $(( (s1-s0)/100 )) wall $(echo "$t1-$t0"|bc)"
python3 - $out/profile_export_aiperf.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for k in ["request_throughput","time_to_first_token","inter_token_latency","usage_prompt_tokens","usage_prompt_cache_read_tokens"]:
    x=d.get(k) or {}; print(k, {s: round(x[s],3) for s in ("avg","p50","p95") if s in x})
PY
kill $pid; wait $pid 2>/dev/null
