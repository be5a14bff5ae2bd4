#!/usr/bin/python3
"""Plots `relaxcc-bench algorithms` JSON rows: step time against link rate,
one line per algorithm and setting; the unshaped link (rate_mbit 0) is drawn
at 2000 Mbit/s. Needs gnuplot.

  bench/plot_algorithms.py rows.jsonl out.png "title"
"""

import collections
import json
import subprocess
import sys

UNSHAPED_AT = 2000


def main(rows_path, png_path, title):
    series = collections.OrderedDict()
    with open(rows_path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("mode") != "algorithms":
                continue
            name = r["algorithm"] if r["setting"] == "defaults" else f'{r["algorithm"]} ({r["setting"]})'
            series.setdefault(name, []).append((r["rate_mbit"] or UNSHAPED_AT, r["step_ms"]))
    script = [
        "set terminal pngcairo size 900,540",
        f'set output "{png_path}"',
        f'set xlabel "link rate (Mbit/s; {UNSHAPED_AT} = unshaped)"',
        'set ylabel "step time (ms)"',
        "set logscale y",
        "set termoption noenhanced",
        "set key below",
        "set grid",
        f'set title "{title}"',
        "plot " + ", ".join(f"'-' with linespoints title \"{name}\"" for name in series),
    ]
    for points in series.values():
        script += [f"{x} {y}" for x, y in sorted(points)] + ["e"]
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
