#!/usr/bin/env bash
# Counts the system calls each proxy of one overhead-bench round makes, per forwarded event:
# tokentap, nginx and HAProxy under the same load (1,000 streams x 200 events every 50 ms), so
# the kernel's share of their CPU can be compared call for call (docs/benchmarks.md, "The
# kernel's share, call for call"). Needs root (perf on syscall tracepoints; tracefs is mounted
# when missing) and built binaries:
#   OVERHEAD_BENCH_BIN=target/release/deps/overhead-<hash> OVERHEAD_TOKENTAP=target/release/tokentap \
#     scripts/syscalls-per-event.sh
# Prints one table: calls per forwarded event by kind, per proxy.
set -euo pipefail
: "${OVERHEAD_BENCH_BIN:?set OVERHEAD_BENCH_BIN to target/release/deps/overhead-<hash>}"
tokentap=${OVERHEAD_TOKENTAP:-$PWD/target/release/tokentap}
out=$(mktemp -d)
[ -d /sys/kernel/tracing/events/syscalls ] || mount -t tracefs nodev /sys/kernel/tracing
calls=(sendto recvfrom writev write read epoll_wait futex epoll_ctl accept4 close)
events=""
for c in "${calls[@]}"; do events+="syscalls:sys_enter_$c,"; done
events+="raw_syscalls:sys_enter,context-switches"

# Attach perf stat to each proxy as it starts; it ends with the proxy.
watch() {
  local seen=""
  while true; do
    for name in tokentap nginx haproxy; do
      case "$seen" in *" $name"*) continue ;; esac
      local pids=""
      case $name in
        tokentap) pids=$(pgrep -f "^$tokentap serve" | paste -sd, || true) ;;
        nginx) pids=$(pgrep -f "nginx: worker" | paste -sd, || true) ;;
        haproxy) pids=$(pgrep -x haproxy | paste -sd, || true) ;;
      esac
      if [ -n "$pids" ]; then
        seen+=" $name"
        perf stat -x, -e "$events" -p "$pids" -o "$out/$name.csv" &
      fi
    done
    sleep 0.2
  done
}
watch &
watcher=$!
OVERHEAD_IDLE=0 OVERHEAD_HELD=0 OVERHEAD_ROUNDS=1 OVERHEAD_FLOOR=0 OVERHEAD_TOKENTAP=$tokentap \
  "$OVERHEAD_BENCH_BIN" --bench > "$out/bench.log" 2>&1
kill "$watcher" 2>/dev/null || true
sleep 1
forwarded=$(grep -E '^\| 1 \| tokentap \|' "$out/bench.log" | awk -F'|' '{gsub(/ /,"",$4); print $4}')
echo "calls per forwarded event ($forwarded events per proxy; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
printf '%-16s' "call"; for name in tokentap nginx haproxy; do printf '%10s' "$name"; done; echo
for c in "${calls[@]}" raw_syscalls:sys_enter context-switches; do
  label=${c#raw_syscalls:sys_enter}; [ -z "$label" ] && label="all calls"
  printf '%-16s' "$label"
  for name in tokentap nginx haproxy; do
    n=$(grep -E ",(syscalls:sys_enter_$c|$c)," "$out/$name.csv" 2>/dev/null | head -1 | cut -d, -f1)
    awk -v n="${n:-0}" -v e="$forwarded" 'BEGIN { printf "%10.2f", (n == "<not counted>" ? 0 : n) / e }'
  done
  echo
done
grep -E '^\| 1 \|' "$out/bench.log"
rm -rf "$out"
