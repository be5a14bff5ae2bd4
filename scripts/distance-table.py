#!/usr/bin/python3
"""The table of scripts/distance-table.sh's rows (OUT/*.jsonl): one column per
link rate and one-way delay, one row per measurement, in Markdown.

    scripts/distance-table.py docs/results/distance

Cells: the round trip (relaxcc-pingpong, median ms); allreduce times (the
median over iterations, largest over ranks, ms; each timed call follows a
barrier, so at a delay D it includes up to D of barrier skew) as relaxcc / MPI;
algorithm step times (mean ms) with the ratio to the same algorithm at 0 ms
of the same rate; straggler cases as kept (loss_x), see docs/benchmarks.md."""
import collections
import json
import os
import sys


def rows(out, part):
    path = os.path.join(out, part + ".jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    out = sys.argv[1]
    cells = collections.defaultdict(dict)  # row name -> (rate, delay) -> text
    order = []

    def put(name, col, text):
        if name not in cells:
            order.append(name)
        cells[name][col] = text

    cols = set()
    for r in rows(out, "pingpong"):
        col = (r["rate_mbit"], r["delay_ms"])
        cols.add(col)
        put("8-byte round trip (ms)", col, "%.2f" % (r["rtt_us"] / 1e3))
        put("floor: 2 round trips (ms)", col, "%.1f" % (2 * r["rtt_us"] / 1e3))
    ar = collections.defaultdict(dict)
    for r in rows(out, "allreduce"):
        col = (r["rate_mbit"], r["delay_ms"])
        cols.add(col)
        ar[(r["bytes"], col)][r["impl"]] = r["time_us"] / 1e3
    for (size, col), t in sorted(ar.items()):
        label = {8: "8 B", 8192: "8 KiB", 8388608: "8 MiB"}.get(size, "%d B" % size)
        put("allreduce %s, relaxcc / MPI (ms)" % label, col,
            "%.1f / %.1f" % (t.get("relaxcc", float("nan")), t.get("mpi", float("nan"))))
    alg = [r for r in rows(out, "algorithms")]
    base = {}
    for r in alg:
        if r["delay_ms"] == 0:
            base[(r["algorithm"], r["setting"], r["rate_mbit"])] = r["step_ms"]
    ddp = rows(out, "ddp")
    for r in ddp:
        if r["delay_ms"] == 0:
            base[("torch_ddp", "gloo", r["rate_mbit"])] = r["step_ms"]
    for r in alg + [dict(r, algorithm="torch_ddp", setting="gloo") for r in ddp]:
        col = (r["rate_mbit"], r["delay_ms"])
        cols.add(col)
        b = base.get((r["algorithm"], r["setting"], r["rate_mbit"]))
        ratio = " (%.2f)" % (r["step_ms"] / b) if b and r["delay_ms"] != 0 else ""
        name = r["algorithm"] + ("" if r["setting"] in ("defaults",) else ", " + r["setting"])
        put("step ms: " + name, col, "%.0f%s" % (r["step_ms"], ratio))
    for r in rows(out, "straggler"):
        col = (r["rate_mbit"], r["delay_ms"])
        cols.add(col)
        put("straggler kept (loss_x): " + r["case"], col, "%.3f (%.2f)" % (r["kept"], r["loss_ratio"]))
        put("straggler even steps/s: " + r["case"], col, "%.2f" % r["even_steps_per_s"])
    cols = sorted(cols, key=lambda c: (-c[0], c[1]))
    head = ["%s Mbit/s, %g ms" % ("%g" % c[0], c[1]) for c in cols]
    print("| | " + " | ".join(head) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name in order:
        print("| " + name + " | " + " | ".join(cells[name].get(c, "") for c in cols) + " |")


if __name__ == "__main__":
    main()
