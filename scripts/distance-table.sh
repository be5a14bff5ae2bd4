#!/bin/bash
# Every relaxation at a distance: 4 emulated hosts at one-way delays and link
# rates, each point a few short relaxcc-hosts calls (each under
# flock /tmp/relaxcc-hosts.lock, so other users of the hosts get turns):
#   pingpong   relaxcc-pingpong, 8-byte round trip between ranks 0 and 1
#   allreduce  relaxcc-bench allreduce, 8 B / 8 KiB / 8 MiB, relaxcc and MPI_Allreduce
#   algorithms relaxcc-bench algorithms, ResNet-50's tensors scaled to 0.1, 200 ms compute
#   ddp        PyTorch DDP on gloo on the same model and compute (bench/peers/ddp_synthetic.py)
#   straggler  relaxcc-bench straggler, rank 3 three times slower from its first step
# Rows go to OUT/<part>.jsonl (relaxcc-hosts adds nothing; each row carries
# rate_mbit and, where the bench records it, delay_ms; the pingpong and ddp
# rows are tagged here). Then scripts/distance-table.py OUT prints the table.
#
#   scripts/distance-table.sh OUT [RATES] [DELAYS] [PARTS]
#   scripts/distance-table.sh docs/results/distance 1000,100 0,10,50,100
set -uo pipefail  # a failed call is reported and the grid goes on
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/distance-table.sh OUT [RATES] [DELAYS] [PARTS]}
RATES=${2:-1000,100}
DELAYS=${3:-0,10,50,100}
PARTS=${4:-pingpong,allreduce,algorithms,ddp,straggler}
BIN=${BIN:-build/ci/bench}
ALGORITHMS=${ALGORITHMS:-gradient_allreduce,bytegrad,local_sgd,decentralized_sgd:shift_one-adaptive,moshpit_sgd,async_model_average,diloco:h8-eager}
CASES=${CASES:-gossip:shift_one,group_average,decentralized_sgd,moshpit_sgd,async_model_average,low_precision_decentralized_sgd}
ITERS=${ITERS:-8} WARMUP=${WARMUP:-2}  # timed and untimed steps of algorithms and ddp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
hosts() { flock /tmp/relaxcc-hosts.lock bench/relaxcc-hosts "$@"; }
tag() {  # JSON rows on stdin, rate and delay added
  /usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"):
        r=json.loads(l); r.update(rate_mbit=float(sys.argv[1]), delay_ms=float(sys.argv[2])); print(json.dumps(r))' "$1" "$2"
}
for rate in ${RATES//,/ }; do
  for d in ${DELAYS//,/ }; do
    link=(--hosts 4 --rate "$rate" --delay-ms "$d")
    echo "== $(date -u +%T) rate $rate Mbit/s, delay $d ms, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    for part in ${PARTS//,/ }; do
      case $part in
        pingpong)
          hosts mpirun "${link[@]}" -- "$BIN/relaxcc-pingpong" 8 20 8 1 | tag "$rate" "$d" >>"$OUT/pingpong.jsonl" ;;
        allreduce)
          hosts mpirun "${link[@]}" -- "$BIN/relaxcc-bench" allreduce -b 8 -e 8M -f 1024 -n 5 -w 1 \
            --place in --impl relaxcc,mpi --json "$OUT/allreduce_$rate.$d.jsonl" >/dev/null
          tag "$rate" "$d" <"$OUT/allreduce_$rate.$d.jsonl" >>"$OUT/allreduce.jsonl"
          rm "$OUT/allreduce_$rate.$d.jsonl" ;;
        algorithms)
          hosts mpirun "${link[@]}" -- "$BIN/relaxcc-bench" algorithms --model-scale 0.1 -n "$ITERS" -w "$WARMUP" \
            --compute-ms 200 --rate-mbit "$rate" --algorithms "$ALGORITHMS" \
            --json "$OUT/algorithms_$rate.$d.jsonl" >/dev/null
          tag "$rate" "$d" <"$OUT/algorithms_$rate.$d.jsonl" >>"$OUT/algorithms.jsonl"
          rm "$OUT/algorithms_$rate.$d.jsonl" ;;
        ddp)
          hosts exec "${link[@]}" -- /usr/bin/python3 bench/peers/ddp_synthetic.py --model-scale 0.1 \
            -n "$ITERS" -w "$WARMUP" --compute-ms 200 --rate-mbit "$rate" --delay-ms "$d" | tag "$rate" "$d" >>"$OUT/ddp.jsonl" ;;
        straggler)
          hosts mpirun "${link[@]}" -- "$BIN/relaxcc-bench" straggler -n 40 -w 5 --compute-ms 100 \
            --dim 262144 --rate-mbit "$rate" --cases "$CASES" --json "$OUT/straggler_$rate.$d.jsonl" >/dev/null
          tag "$rate" "$d" <"$OUT/straggler_$rate.$d.jsonl" >>"$OUT/straggler.jsonl"
          rm "$OUT/straggler_$rate.$d.jsonl" ;;
        *) echo "unknown part $part" >&2; exit 2 ;;
      esac
    done
  done
done
