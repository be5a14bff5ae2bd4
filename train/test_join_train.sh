#!/bin/bash
# relaxcc-train --join: 3 processes train with --elastic without mpirun (UCX
# wing); once they have trained a while a fourth starts with --join (the
# store's address only, no RANK/WORLD_SIZE). It is admitted at a step's end
# with the whole training state; all four finish both epochs on the view
# epoch 1 {0,1,2,3} with bit-identical models and reach the accuracy of a
# short run.
#   test_join_train.sh <relaxcc-train> [more relaxcc-train options]
set -u
train=$1
shift
port=$("$(dirname "$0")/../scripts/free-port") || exit 1
out=$(mktemp -d)
pids=()
trap 'kill -9 "${pids[@]}" 2>/dev/null; rm -rf "$out"' EXIT
export RELAXCC_RENDEZVOUS=127.0.0.1:$port RELAXCC_TIMEOUT_MS=30000 UCX_NET_DEVICES=lo
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK RANK WORLD_SIZE
args=(--transport ucx --elastic --epochs 2 --batch 16 --evals-per-epoch 1 "$@")
for r in 0 1 2; do
  RANK=$r WORLD_SIZE=3 "$train" "${args[@]}" >"$out/$r" 2>"$out/$r.err" &
  pids+=($!)
done
# Joins once rank 0 has trained a while (it draws its progress bar).
for _ in $(seq 1 600); do
  grep -q "epoch 1/2 \[#" "$out/0.err" 2>/dev/null && break
  sleep 0.1
done
"$train" "${args[@]}" --join --join-wait 30000 >"$out/3" 2>"$out/3.err" &
pids+=($!)
status=0
for r in 0 1 2 3; do
  wait "${pids[$r]}" || { echo "process $r exited with $?"; tail -5 "$out/$r.err"; status=1; }
done
cat "$out/0"
tr '\r' '\n' <"$out/0.err" | grep "newcomers admitted" || { echo "no admission reported"; status=1; }
grep "admitted to epoch 1 {0,1,2,3} as rank 3" "$out/3.err" || { echo "the newcomer was not admitted as rank 3"; status=1; }
grep -q "4 ranks, 2 epochs" "$out/0" || { echo "rank 0 did not finish on 4 ranks"; status=1; }
grep -q "view epoch 1 {0,1,2,3}" "$out/0" || { echo "rank 0 did not end on epoch 1 {0,1,2,3}"; status=1; }
# Every process ends with the same model (bit-identical: gradient_allreduce).
hashes=$(cat "$out"/[0-3].err | tr '\r' '\n' | sed -n 's/.*model hash \([0-9]*\).*/\1/p' | sort | uniq -c)
echo "model hashes (count, hash): $hashes"
[ "$(echo "$hashes" | awk '{print $1}')" = "4" ] || { echo "the four processes end with different models"; status=1; }
accuracy=$(sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p' "$out/0")
awk -v a="${accuracy:-0}" 'BEGIN { exit !(a >= 0.75) }' || { echo "accuracy ${accuracy:-none} < 0.75"; status=1; }
exit $status
