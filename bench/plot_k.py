#!/usr/bin/python3
"""Plots the `relaxcc-bench algorithms` results of the decentralized,
asynchronous and DiLoCo modules (docs/benchmarks.md)
from the JSON rows recorded under docs/results/. Needs matplotlib
(python3-matplotlib).

  bench/plot_k.py [results_dir]   # default docs/results; writes k_*.png there

  k_bytes_and_step.png     bytes per step and step time (x gradient_allreduce),
                           every decentralized, asynchronous and DiLoCo
                           module, 2 and 4 hosts, ResNet-50
  k_diloco_h500.png        DiLoCo at H 500, 100 Mbit/s: mean step time
                           against the no-sync step (both runs)
  k_streaming_peak.png     Streaming DiLoCo: peak bytes one rank sends in one
                           step, against the fragment count
  k_straggler.png          one of 4 ranks 3x slower: ranks 0-2's step-rate
                           ratio, unshaped and 1000 Mbit/s (both runs)
"""

import collections
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(directory, name):
    with open(os.path.join(directory, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def label(r):
    return r["algorithm"] if r["setting"] == "defaults" else f'{r["algorithm"]}\n({r["setting"]})'


def bytes_and_step(d, out):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    for i, (hosts, name) in enumerate([(2, "algorithms_k_2hosts_back_to_back.jsonl"),
                                       (4, "algorithms_k_4hosts_back_to_back.jsonl")]):
        rs = rows(d, name)
        base = next(r for r in rs if r["algorithm"] == "gradient_allreduce")
        ys = range(len(rs))
        w = 0.4
        off = [y + (i - 0.5) * w for y in ys]
        ax1.barh(off, [r["bytes_per_step"] for r in rs], height=w, label=f"{hosts} hosts")
        ax2.barh(off, [r["step_ms"] / base["step_ms"] for r in rs], height=w, label=f"{hosts} hosts")
        labels = [label(r) for r in rs]
    for ax in (ax1, ax2):
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_xscale("log")
    ax1.set_xlabel("bytes sent per step and rank (log)")
    ax2.set_xlabel("step time / gradient_allreduce's")
    ax2.axvline(1.0, color="gray", lw=0.8)
    ax2.set_yticklabels([])
    fig.suptitle("Decentralized, asynchronous and DiLoCo modules, ResNet-50 (25.6M f32), 200 ms compute, unshaped links")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def diloco_h500(d, out):
    rs = rows(d, "diloco_h500_2hosts_100mbit.jsonl")
    runs = collections.OrderedDict()
    for r in rs:
        runs.setdefault(r["setting"], []).append(r["step_ms"])
    nosync = runs.pop("H 100000")[-1]  # run 1's no-sync row took a load burst
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(runs)
    for j in range(2):
        ax.bar([i + (j - 0.5) * 0.38 for i in range(len(names))],
               [runs[n][j] / nosync for n in names], width=0.38, label=f"run {j + 1}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.axhline(1.05, color="red", lw=0.8, ls="--", label="target 1.05x")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel(f"mean step / no-sync step ({nosync:.1f} ms)")
    ax.set_title("DiLoCo H 500, 2 hosts at 100 Mbit/s, 50 ms compute")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def streaming_peak(d, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, style in [("diloco_streaming_peak_2hosts_100mbit.jsonl", "o-"),
                        ("diloco_streaming_peak_2hosts_unshaped.jsonl", "s--")]:
        pts = collections.OrderedDict()
        for r in rows(d, name):
            f = 1
            if "fragments" in r["setting"]:
                f = int(r["setting"].split(", ")[1].split()[0])
            pts[f] = r["peak_bytes_per_step"]
        xs = sorted(pts)
        link = "100 Mbit/s" if "100mbit" in name else "unshaped"
        ax.plot(xs, [pts[x] / 1e6 for x in xs], style, label=f"peak bytes, {link}")
    base = pts[1] / 1e6
    ax.plot(xs, [base / 10] * len(xs), "r:", label="target: 10x below plain DiLoCo")
    ax.set_xlabel("fragments (H 50)")
    ax.set_ylabel("MB one rank sends in its busiest step")
    ax.set_xticks(xs)
    ax.set_title("Streaming DiLoCo's peak, 2 hosts, ResNet-50")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def straggler(d, out):
    fig, ax = plt.subplots(figsize=(9, 4.8))
    groups = collections.OrderedDict()
    for link, name in [("unshaped", "algorithms_k_straggler_4hosts_unshaped.jsonl"),
                       ("1000 Mbit/s", "algorithms_k_straggler_4hosts_1000mbit.jsonl")]:
        for r in rows(d, name):
            groups.setdefault(label(r), {}).setdefault(link, []).append(r["step_rate_ratio"])
    names = list(groups)
    for j, link in enumerate(["unshaped", "1000 Mbit/s"]):
        for i, n in enumerate(names):
            vals = groups[n].get(link, [])
            x = i + (j - 0.5) * 0.38
            if vals:
                ax.bar(x, min(vals), width=0.38, color=f"C{j}", label=link if i == 0 else None)
                ax.plot([x, x], [min(vals), max(vals)], color="black", lw=1)
    ax.axhline(0.85, color="red", lw=0.8, ls="--", label="target 0.85")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=7)
    ax.set_ylabel("ranks 0-2's step rate, straggler / none\n(bar: lowest run, line: range)")
    ax.set_title("One of 4 ranks 3x slower (ResNet-50 x 0.1, 200 ms compute)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(directory="docs/results"):
    bytes_and_step(directory, os.path.join(directory, "k_bytes_and_step.png"))
    diloco_h500(directory, os.path.join(directory, "k_diloco_h500.png"))
    streaming_peak(directory, os.path.join(directory, "k_streaming_peak.png"))
    straggler(directory, os.path.join(directory, "k_straggler.png"))


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
