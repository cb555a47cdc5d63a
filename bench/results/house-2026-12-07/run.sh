#!/usr/bin/env bash
# Issue 68, item 5: relokv_report's engine and attention figures and relokv_server's throughput
# on the plain-prompt RAG workload, before the issue's changes (commit ec8003a, BEFORE_BUILD)
# and after (AFTER_BUILD), alternated in one run on one machine (A B A B ...), medians.
#   BEFORE_BUILD=/work/before-build AFTER_BUILD=build-bench bench/results/house-2026-12-07/run.sh
# Both builds: -DCMAKE_BUILD_TYPE=Release -DRELOKV_BUILD_BENCH=ON (scripts/bench's).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
before=${BEFORE_BUILD:?}
after=${AFTER_BUILD:?}
rounds=${ROUNDS:-2}
reps=${REPS:-7}
users=${USERS:-16}
requests=${REQUESTS:-32}
model=$("$root/scripts/get-model" smollm2)
work=$(mktemp -d)
pid=""
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
serve() {  # build tag round
  local port; port=$(free_port)
  "$1/examples/server/relokv_server" --model "$model" --host 127.0.0.1 --port "$port" \
    --strategy epic --parallel "$users" --spans auto >"$work/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
  python3 "$root/bench/serve_load.py" --url "http://127.0.0.1:$port/v1" --workload "$work/w.json" \
    --users "$users" --prefix "server_$2_r$3_" | tee -a "$work/lines"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}
python3 "$root/bench/rag_workload.py" --docs 10 --requests "$requests" --max-tokens 16 --out "$work/w.json" >/dev/null
for r in $(seq 1 "$rounds"); do
  for tag in before after; do
    b=$before; [ "$tag" = after ] && b=$after
    "$b/bench/relokv_report" --reps "$reps" --filter engine_ | sed "s/^/${tag}_r${r}_/" | tee -a "$work/lines"
    "$b/bench/relokv_report" --reps "$reps" --filter decode_ | sed "s/^/${tag}_r${r}_/" | tee -a "$work/lines"
    serve "$b" "$tag" "$r"
  done
done
python3 - "$work/lines" "$rounds" <<'PY'
import statistics, sys, collections
vals = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if not l.strip() or l[0] == "#": continue
    k, v = l.split()[:2]
    for tag in ("before", "after"):
        for r in range(1, int(sys.argv[2]) + 1):
            for pre in (f"{tag}_r{r}_", f"server_{tag}_r{r}_"):
                if k.startswith(pre):
                    name = k[len(pre):] if pre[0] != "s" else "server_" + k[len(pre):]
                    vals[(name, tag)].append(float(v))
names = sorted({n for n, _ in vals})
print("# figure before after after/before (medians over rounds)")
for n in names:
    b, a = vals.get((n, "before")), vals.get((n, "after"))
    if not b or not a: continue
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"{n} {mb:.4g} {ma:.4g} {ma / mb if mb else float('nan'):.3f}")
PY
