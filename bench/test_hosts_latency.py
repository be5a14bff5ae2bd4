#!/usr/bin/python3
"""Latency and per-host rates of relaxcc-hosts' emulated links (CTest: hosts_latency).

Measures, on a plain fabric and through relaxcc-relay:
  - the round trip by ping (median) and by an 8-byte MPI ping-pong
    (relaxcc-pingpong, the fastest of its round trips: polling ranks lose
    up to a scheduler slice per round trip on a busy machine) between two
    hosts at 10 and 50 ms one-way delay: within 10% of 2x the delay plus the
    plain link's round trip (measured the same way);
  - a 64 MiB MPI transfer at 1 Gbit/s and 10 ms: at least 0.9 of the plain
    link's rate (the rate with the round trip taken out; the raw figure is
    printed too); at 50 ms, iperf3 after its slow start (2 s) against the
    plain link's, at least 0.9;
  - per-host rates and delays (3 hosts at 1000, 1000, 200 Mbit/s, delays
    0, 0, 20 ms): iperf3 to the 200 Mbit/s host within 10% of 200, to a
    1000 Mbit/s host at least 0.9 of 1000 x the frame-overhead ceiling, and
    the round trip to the far host within 10% of 20 ms plus the plain one.
--cost instead compares iperf3 through the relay at 0 ms with the plain link
at 1 Gbit/s (what the relay costs), 5 s each way, three times.

Exit 77 (CTest skip) with the reason printed without root or namespaces.

  bench/test_hosts_latency.py --relay build/ci/bench/relaxcc-relay --pingpong build/ci/bench/relaxcc-pingpong
"""

import argparse
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FRAME_CEILING = 0.956  # TCP payload of a 1500-byte MTU Ethernet frame, of the line rate


def load_hosts_module():
    path = os.path.join(HERE, "relaxcc-hosts")
    loader = importlib.machinery.SourceFileLoader("relaxcc_hosts", path)
    spec = importlib.util.spec_from_loader("relaxcc_hosts", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


hosts = load_hosts_module()
fabrics = []
failures = []


def fabric_up(n, relay, rates, delays=None):
    fabric = hosts.Fabric(n, relay if delays is not None else None)
    fabrics.append(fabric)
    fabric.up()
    fabric.shape(rates)
    if delays is not None:
        fabric.set_delays(delays)
    return fabric


def fabric_down(fabric):
    fabric.down()
    fabrics.remove(fabric)


def ping_ms(fabric, src, dst, count, interval):
    """Median round trip in ms of `count` pings (the first, which waits for ARP, left out)."""
    out = subprocess.run(["ip", "netns", "exec", fabric.ns[src], "ping", "-n", "-c", str(count + 1), "-i",
                          str(interval), fabric.ips[dst]], check=True, capture_output=True, text=True).stdout
    times = [float(t) for t in re.findall(r"time=([0-9.]+) ms", out)][1:]
    if len(times) < count * 0.9:
        raise SystemExit(f"test_hosts_latency: {len(times)} of {count} pings answered:\n{out}")
    return statistics.median(times)


def pingpong(fabric, binary, iters, big_iters):
    """relaxcc-pingpong between hosts 0 and 1: its JSON line."""
    cmd = fabric.mpirun_cmd(1, [binary, "8", str(iters), str(64 << 20), str(big_iters)], hosts.FAIR_MPI_MCA)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"test_hosts_latency: relaxcc-pingpong failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


def iperf3_mbit(fabric, src, dst, seconds, omit=1, port=5311):
    """Received Mbit/s of one iperf3 stream from host src to host dst, over
    `seconds` after the first `omit` (TCP's slow start)."""
    server = subprocess.Popen(["ip", "netns", "exec", fabric.ns[dst], "iperf3", "-s", "-1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = subprocess.run(["ip", "netns", "exec", fabric.ns[src], "iperf3", "-c", fabric.ips[dst], "-p", str(port),
                              "-t", str(seconds + omit), "-O", str(omit), "-J"], check=True, capture_output=True, text=True,
                             timeout=seconds + 30).stdout
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def check(name, value, low, high, unit):
    ok = low <= value <= high
    print(f"  {name}: {value:.3f} {unit} (bounds {low:.3f}-{high:.3f}) {'ok' if ok else 'FAILED'}", flush=True)
    if not ok:
        failures.append(name)


def latency_checks(args):
    print("plain link, 2 hosts at 1000 Mbit/s:", flush=True)
    plain = fabric_up(2, args.relay, 1000.0)
    plain_ping = ping_ms(plain, 0, 1, 20, 0.01)
    plain_mpi = pingpong(plain, args.pingpong, 200, 3)
    plain_iperf = iperf3_mbit(plain, 0, 1, 2)
    fabric_down(plain)
    print(f"  iperf3 {plain_iperf:.0f} Mbit/s; ping {plain_ping:.3f} ms; MPI 8-byte round trip {plain_mpi['rtt_us'] / 1e3:.3f} ms (fastest {plain_mpi['rtt_min_us'] / 1e3:.3f}); 64 MiB in "
          f"{plain_mpi['transfer_ms']:.1f} ms: {plain_mpi['rate_mbit']:.0f} Mbit/s (raw {plain_mpi['raw_mbit']:.0f})",
          flush=True)

    delayed = fabric_up(2, args.relay, 1000.0, [10.0, 10.0])
    for delay, pings, interval, iters in ((10.0, 20, 0.03, 40), (50.0, 10, 0.11, 16)):
        if delay != 10.0:
            delayed.set_delays([delay, delay])
        print(f"through the relay, {delay:g} ms one-way:", flush=True)
        rtt = ping_ms(delayed, 0, 1, pings, interval)
        mpi = pingpong(delayed, args.pingpong, iters, 3)
        want_ping = 2 * delay + plain_ping
        want_mpi = 2 * delay + plain_mpi["rtt_min_us"] / 1e3
        check(f"ping round trip at {delay:g} ms", rtt, 0.9 * want_ping, 1.1 * want_ping, "ms")
        # The fastest MPI round trip: Open MPI's ranks poll, and on a busy
        # machine a preempted rank adds up to a scheduler slice to a round
        # trip; ping sleeps in the kernel and is woken at once.
        check(f"MPI 8-byte round trip at {delay:g} ms (fastest)", mpi["rtt_min_us"] / 1e3, 0.9 * want_mpi,
              1.1 * want_mpi, "ms")
        print(f"  MPI 8-byte round trip, median: {mpi['rtt_us'] / 1e3:.3f} ms", flush=True)
        print(f"  64 MiB in {mpi['transfer_ms']:.1f} ms: {mpi['rate_mbit']:.0f} Mbit/s with the round trip "
              f"taken out (raw {mpi['raw_mbit']:.0f}); plain {plain_mpi['rate_mbit']:.0f}", flush=True)
        if delay == 10.0:
            check("64 MiB rate at 10 ms / plain", mpi["rate_mbit"] / plain_mpi["rate_mbit"], 0.9, 10.0, "")
        else:
            # One 64 MiB MPI message pays Open MPI's rendezvous round trips;
            # the link's own rate is TCP's once its window is open.
            check("iperf3 at 50 ms / plain", iperf3_mbit(delayed, 0, 1, 2, omit=2) / plain_iperf, 0.9, 10.0, "")
    fabric_down(delayed)

    print("per-host rates 1000,1000,200 Mbit/s and delays 0,0,20 ms, 3 hosts:", flush=True)
    mixed = fabric_up(3, args.relay, [1000.0, 1000.0, 200.0], [0.0, 0.0, 20.0])
    near = ping_ms(mixed, 0, 1, 10, 0.01)
    far = ping_ms(mixed, 0, 2, 10, 0.03)
    fast = iperf3_mbit(mixed, 0, 1, 2)
    slow = iperf3_mbit(mixed, 0, 2, 2)
    fabric_down(mixed)
    check("iperf3 to the 1000 Mbit/s host / 1000", fast / 1000.0, 0.9 * FRAME_CEILING, 1.02, "")
    check("iperf3 to the 200 Mbit/s host", slow, 180.0, 220.0, "Mbit/s")
    print(f"  ping to the 0 ms host {near:.3f} ms (plain {plain_ping:.3f})", flush=True)
    want = 20.0 + plain_ping  # one-way (0 + 20) / 2 each way
    check("ping round trip to the 20 ms host", far, 0.9 * want, 1.1 * want, "ms")


def cost_checks(args):
    """iperf3 at 1 Gbit/s, plain and through the relay at 0 ms, alternating."""
    results = {"plain": [], "relay 0 ms": []}
    for _ in range(3):
        for name, delays in (("plain", None), ("relay 0 ms", [0.0, 0.0])):
            fabric = fabric_up(2, args.relay, 1000.0, delays)
            results[name].append(min(iperf3_mbit(fabric, 0, 1, 5), iperf3_mbit(fabric, 1, 0, 5)))
            fabric_down(fabric)
    for name, values in results.items():
        print(f"  {name}: " + ", ".join(f"{v:.0f}" for v in values) + f" Mbit/s (median {statistics.median(values):.0f})")
    ratio = statistics.median(results["relay 0 ms"]) / statistics.median(results["plain"])
    check("relay at 0 ms / plain link, 1 Gbit/s", ratio, 0.9, 10.0, "")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--relay", required=True, help="relaxcc-relay binary")
    parser.add_argument("--pingpong", required=True, help="relaxcc-pingpong binary")
    parser.add_argument("--cost", action="store_true", help="measure what the relay costs at 0 ms instead")
    args = parser.parse_args()
    for tool in ("ping", "iperf3"):
        if not hosts.shutil.which(tool):
            hosts.refuse(f"'{tool}' not found (bash scripts/install-deps.sh installs it)")
    hosts.check_privileges()
    args.relay = os.path.abspath(args.relay)
    args.pingpong = os.path.abspath(args.pingpong)

    def on_signal(signum, _frame):
        for fabric in list(fabrics):
            fabric.down()
        raise SystemExit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    start = time.monotonic()
    try:
        cost_checks(args) if args.cost else latency_checks(args)
    finally:
        for fabric in list(fabrics):
            fabric.down()
    print(f"{time.monotonic() - start:.1f} s; load {os.getloadavg()[0]:.2f}; "
          + (f"FAILED: {', '.join(failures)}" if failures else "all within bounds"), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
