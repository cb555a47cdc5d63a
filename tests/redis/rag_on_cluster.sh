#!/usr/bin/env bash
# relokv_rag's store mode on a Redis Cluster started for it (scripts/redis-cluster: 3 masters,
# 3 replicas on loopback ports) and stopped at the end, whatever happens.
#   tests/redis/rag_on_cluster.sh RELOKV_RAG SCRIPTS_REDIS_CLUSTER [relokv_rag args...]
set -euo pipefail
rag=$1
cluster=$2
shift 2
out=$("$cluster" start)
trap '"$cluster" stop "${out#* }"' EXIT
"$rag" --store "${out% *}" "$@"
