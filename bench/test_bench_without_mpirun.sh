#!/bin/bash
# relaxcc-bench started twice without mpirun (RELAXCC_RENDEZVOUS, RANK,
# WORLD_SIZE), on the UCX wing: both ranks finish, and no result is wrong.
#   test_bench_without_mpirun.sh <relaxcc-bench>
set -u
bench=$1
port=$("$(dirname "$0")/../scripts/free-port") || exit 1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(allreduce -b 8 -e 1M -f 32 -n 20 -w 2 --impl relaxcc --transport ucx)
export RELAXCC_RENDEZVOUS=127.0.0.1:$port WORLD_SIZE=2 RELAXCC_TIMEOUT_MS=20000
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK
RANK=1 timeout 60 "$bench" "${args[@]}" >"$out/1" 2>&1 &
one=$!
RANK=0 timeout 60 "$bench" "${args[@]}" >"$out/0" 2>&1
zero=$?
wait "$one"
one=$?
cat "$out/0"
if [ "$zero" -ne 0 ] || [ "$one" -ne 0 ]; then
  echo "rank 0 exited with $zero, rank 1 with $one"; cat "$out/1"; exit 1
fi
rows=$(grep -cE '^ +[0-9]+ ' "$out/0")
wrong=$(awk '/^ +[0-9]+ / && $NF != 0' "$out/0" | wc -l)
if [ "$rows" -ne 8 ] || [ "$wrong" -ne 0 ]; then
  echo "expected 8 result rows with no wrong element: $rows rows, $wrong with wrong elements"; exit 1
fi
echo "2 ranks without mpirun: $rows rows, none wrong"
