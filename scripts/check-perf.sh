#!/usr/bin/env bash
# Performance regression check, run by hand before resolving an issue that
# touches the engine or the primitives (not in CI: timings there are not
# trustworthy). Runs the figures of docs/benchmarks.md that earlier issues
# met, compares each ratio to its target below, prints every figure, and
# exits 1 when one misses (2 when a run fails).
#
# Usage: scripts/check-perf.sh [--build DIR] [--runs N] [--only hosts|shm|straggler]...
#   --build DIR  the build tree holding bench/relaxcc-bench (default build/ci)
#   --runs N     runs of each command (default 2); a target counts as met
#                when the median of its runs meets it
#   --only S     run only these checks (repeatable)
# Needs root for the emulated hosts (bench/relaxcc-hosts makes network
# namespaces); one relaxcc-hosts run at a time on a machine
# (flock /tmp/relaxcc-hosts.lock). Before every run it waits, polling every
# 30 s for up to 10 minutes (CHECK_PERF_WAIT_POLLS polls), for the 1-minute
# load average to fall below CHECK_PERF_MAX_LOAD (1.5), and prints the load
# it ran at.
set -euo pipefail
cd "$(dirname "$0")/.."

# The targets, in one place: "check|label|target".
#   hosts: MPI_Allreduce time / compressed allreduce time, 2 emulated hosts
#          at 1 Gbit/s, 64 MiB;
#   shm:   relaxcc busbw / MPI_Allreduce busbw, 2 ranks on shared memory,
#          out of place, ordinary and communicator memory, and in place on
#          communicator memory;
#   straggler: the others' step rate with rank 3 of 4 three times slower
#          from its first step over their rate without it: the primitives
#          bench's group averaging and the straggler bench's cases at
#          20 ms of compute.
TARGETS=(
  "hosts|compressed_8bit 64M|3.5"
  "hosts|compressed_4bit 64M|6.0"
  "shm|relaxcc out 1M|0.9"
  "shm|relaxcc out 4M|1.0"
  "shm|relaxcc out 16M|1.0"
  "shm|relaxcc out 64M|1.0"
  "shm|relaxcc-shared out 1M|0.9"
  "shm|relaxcc-shared out 4M|1.0"
  "shm|relaxcc-shared in 1M|0.9"
  "shm|relaxcc-shared in 4M|1.0"
  "shm|relaxcc-shared in 16M|1.0"
  "shm|relaxcc-shared in 64M|1.0"
  "straggler|primitives group averaging|0.85"
  "straggler|gossip:shift_one|0.85"
  "straggler|gossip:ring|0.85"
  "straggler|gossip:exponential|0.85"
  "straggler|group_average|0.85"
  "straggler|async|0.85"
  "straggler|decentralized_sgd|0.85"
  "straggler|moshpit_sgd|0.85"
  "straggler|async_model_average|0.85"
  "straggler|low_precision_decentralized_sgd|0.85"
)

BUILD=build/ci
RUNS=2
ONLY=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --only) ONLY+=("$2"); shift 2 ;;
    *) echo "check-perf: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
BENCH=$BUILD/bench/relaxcc-bench
[[ -x $BENCH ]] || { echo "check-perf: no $BENCH (build the relaxcc-bench target)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MAX_LOAD=${CHECK_PERF_MAX_LOAD:-1.5}
WAIT_POLLS=${CHECK_PERF_WAIT_POLLS:-20}
OUT=$(mktemp -d /tmp/check-perf.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

wanted() {
  [[ ${#ONLY[@]} -eq 0 ]] && return 0
  local s
  for s in "${ONLY[@]}"; do [[ $s == "$1" ]] && return 0; done
  return 1
}

wait_quiet() {
  local i load
  for ((i = 0; i < WAIT_POLLS; ++i)); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    awk -v l="$load" -v m="$MAX_LOAD" 'BEGIN { exit !(l < m) }' && break
    sleep 30
  done
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "# $(date -u +%FT%TZ) load average $load$(awk -v l="$load" -v m="$MAX_LOAD" \
    'BEGIN { if (l >= m) printf " (above %s after waiting: figures may be low)", m }')"
}

# run LABEL JSON COMMAND...: one timed run, its JSON rows appended to JSON.
run() {
  local label=$1 json=$2
  shift 2
  wait_quiet
  echo "# $label: $*"
  if ! "$@" --json "$json" > "$OUT/last.txt" 2>&1; then
    cat "$OUT/last.txt"
    echo "check-perf: FAILED to run: $*" >&2
    exit 2
  fi
  grep -v '^\[' "$OUT/last.txt" | tail -n 40
}

for ((k = 1; k <= RUNS; ++k)); do
  if wanted hosts; then
    [[ $(id -u) -eq 0 ]] || { echo "check-perf: hosts needs root" >&2; exit 2; }
    run "hosts, run $k" "$OUT/hosts.jsonl" flock /tmp/relaxcc-hosts.lock \
      bench/relaxcc-hosts mpirun --hosts 2 --rate 1000 -- "$BENCH" primitives -b 64M -n 5 -w 2 \
      --primitives mpi,all,compressed_8bit,compressed_4bit --rate-mbit 1000
  fi
  if wanted shm; then
    run "shm, run $k" "$OUT/shm.jsonl" mpirun -np 2 "$BENCH" allreduce -b 1M -e 64M -f 4 -n 30 \
      -w 5 --impl relaxcc,relaxcc-shared,mpi
  fi
  if wanted straggler; then
    run "straggler, run $k" "$OUT/straggler.jsonl" mpirun -np 4 --oversubscribe --bind-to none \
      "$BENCH" primitives -b 4M -n 10 -w 2 --straggler 3 --straggler-rounds 60
    run "straggler bench, run $k" "$OUT/straggler.jsonl" mpirun -np 4 --oversubscribe \
      --bind-to none "$BENCH" straggler -n 60 -w 10 --compute-ms 20
  fi
done

# Ratios per run from the JSON rows, the median over runs against each target.
python3 - "$OUT" "${TARGETS[@]}" <<'EOF'
import json, os, statistics, sys

out, targets = sys.argv[1], [t.split("|") for t in sys.argv[2:]]

def rows(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]

def size(b):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale}{unit}"
    return str(b)

ratios = {}  # (check, label) -> [ratio per run]
# hosts: MPI_Allreduce time / primitive time in the same run.
for r in rows("hosts.jsonl"):
    if r.get("mode") == "primitives" and r["primitive"] != "mpi" and r.get("time_vs_mpi_allreduce"):
        ratios.setdefault(("hosts", f"{r['primitive']} {size(r['bytes'])}"), []).append(
            1.0 / r["time_vs_mpi_allreduce"])
# shm: busbw over MPI_Allreduce's busbw in the same run and placement.
run_mpi = {}
pending = []
for r in rows("shm.jsonl"):
    if r.get("mode") != "allreduce":
        continue
    key = (r["place"], r["bytes"])
    if r["impl"] == "mpi":
        for p in [p for p in pending if (p["place"], p["bytes"]) == key]:
            ratios.setdefault(("shm", f"{p['impl']} {p['place']} {size(p['bytes'])}"), []).append(
                p["busbw_gbps"] / r["busbw_gbps"])
            pending.remove(p)
    else:
        pending.append(r)
# straggler: the others' rate with the straggler over their rate without it.
for r in rows("straggler.jsonl"):
    if r.get("mode") == "primitives_straggler":
        ratios.setdefault(("straggler", "primitives group averaging"), []).append(
            r["deadline_vs_base"])
    elif r.get("mode") == "straggler":
        ratios.setdefault(("straggler", r["case"]), []).append(r["kept"])

missed = 0
wrong = [r for r in rows("shm.jsonl") if r.get("wrong")]
for r in wrong:
    print(f"shm   {r['impl']} {r['place']} {size(r['bytes'])}: {r['wrong']} wrong elements  MISSED")
missed += len(wrong)
for check, label, target in targets:
    got = ratios.get((check, label))
    if got is None:
        continue
    med = statistics.median(got)
    ok = med >= float(target)
    missed += not ok
    runs = ", ".join(f"{g:.2f}" for g in got)
    print(f"{check:5} {label:28} {med:5.2f}x (runs {runs})  target >= {target}x  "
          f"{'met' if ok else 'MISSED'}")
print("check-perf: every target met" if not missed else f"check-perf: {missed} target(s) missed")
sys.exit(1 if missed else 0)
EOF
