#!/usr/bin/env python3
"""Splits a `perf record -g` profile of one process by the system call each sample ran under.

    perf record -F 999 -g -p <pid> -o soak.data -- sleep 25
    perf script -i soak.data -F comm,tid,ip,sym | scripts/perf-by-syscall.py

Prints the share of samples under each call (the first `__x64_sys_*` frame of the kernel
stack), and for sendto/recvfrom the part spent in the softirq receive path (`net_rx_action`):
over loopback the sender's context runs the receiving socket's TCP processing, so a send pays
for the peer's receive and a read pays for the ACK it sends (docs/benchmarks.md).
"""
import collections
import re
import sys

by_call = collections.Counter()
by_side = collections.Counter()
total = 0
for sample in sys.stdin.read().split("\n\n"):
    frames = [line.strip() for line in sample.strip().splitlines()[1:] if line.strip()]
    if not frames:
        continue
    total += 1
    call = next(
        (m.group(1) for m in (re.search(r"__x64_sys_(\w+)", f) for f in frames) if m),
        "(none: user space, faults, interrupts)",
    )
    by_call[call] += 1
    if call in ("sendto", "recvfrom"):
        peer = any("net_rx_action" in f for f in frames)
        by_side[(call, "the peer's receive (softirq)" if peer else "its own path")] += 1
if total == 0:
    sys.exit("no samples on stdin (perf script -F comm,tid,ip,sym)")
print(f"{total} samples")
for call, n in by_call.most_common():
    print(f"{100 * n / total:6.1f} %  {call}")
for (call, side), n in sorted(by_side.items()):
    print(f"{100 * n / total:6.1f} %  {call}: {side}")
