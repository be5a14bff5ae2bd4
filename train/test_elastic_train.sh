#!/bin/bash
# relaxcc-train --elastic on 4 processes without mpirun (UCX wing): rank 3 is
# SIGKILLed while they train; ranks 0-2 go on on the view epoch 1 {0,1,2},
# finish both epochs and reach the accuracy of a short run.
#   test_elastic_train.sh <relaxcc-train>
set -u
train=$1
port=$("$(dirname "$0")/../scripts/free-port") || exit 1
out=$(mktemp -d)
pids=()
trap 'kill -9 "${pids[@]}" 2>/dev/null; rm -rf "$out"' EXIT
export RELAXCC_RENDEZVOUS=127.0.0.1:$port WORLD_SIZE=4 RELAXCC_TIMEOUT_MS=30000 UCX_NET_DEVICES=lo
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK
for r in 0 1 2 3; do
  RANK=$r "$train" --transport ucx --elastic --epochs 2 --batch 16 --evals-per-epoch 1 \
    >"$out/$r" 2>"$out/$r.err" &
  pids+=($!)
done
# Killed once every rank has trained a while (rank 0 draws its progress bar).
for _ in $(seq 1 600); do
  grep -q "epoch 1/2 \[#" "$out/0.err" 2>/dev/null && break
  sleep 0.1
done
sleep 1
kill -9 "${pids[3]}"
status=0
for r in 0 1 2; do
  wait "${pids[$r]}" || { echo "rank $r exited with $?"; tail -5 "$out/$r.err"; status=1; }
done
cat "$out/0"
tr '\r' '\n' <"$out/0.err" | grep "went on without lost members" || { echo "no view change reported"; status=1; }
grep -q "3 ranks, 2 epochs, 1874 steps" "$out/0" || { echo "rank 0 did not finish 1874 steps on 3 ranks"; status=1; }
grep -q "view epoch 1 {0,1,2}" "$out/0" || { echo "rank 0 did not end on epoch 1 {0,1,2}"; status=1; }
accuracy=$(sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p' "$out/0")
awk -v a="${accuracy:-0}" 'BEGIN { exit !(a >= 0.75) }' || { echo "accuracy ${accuracy:-none} < 0.75"; status=1; }
exit $status
