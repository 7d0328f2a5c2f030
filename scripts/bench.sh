#!/usr/bin/env bash
# Runs tokentap's benchmarks and prints the figures recorded in docs/benchmarks.md.
# Every figure is a ratio or a count measured against a baseline in the same run.
#   scripts/bench.sh                       all benches
#   scripts/bench.sh stream                only the hot-path bench
#   scripts/bench.sh overhead              only the end-to-end bench (direct vs tokentap vs nginx vs HAProxy)
#   scripts/bench.sh overhead --dedicated  the bars with the proxy on cores of its own: proxy, upstream
#                                          and client pinned to disjoint cores (8 or more; with 2-7 the
#                                          last core is the proxy's and the rest are shared by upstream
#                                          and client), 1,000 and 10,000 streams, one verdict per bar
#   scripts/bench.sh overhead --ab OLD_BINARY   the tree's tokentap against another build, interleaved
#                                          A B A B (OVERHEAD_ROUNDS, default 5)
# Every overhead run prints each proxy's median and spread over its interleaved rounds and a noise
# verdict: when nginx or the floor relay moves more than 15 % between rounds (the bar's own
# margin) the CPU ratio is reported NOT JUDGED instead of PASS or FAIL. Rounds are clean ones: a
# round in which the hypervisor took more than 5 % of the machine (steal, OVERHEAD_MAX_STEAL) in
# any measured window is run again, up to twice the rounds in all (OVERHEAD_MAX_ROUNDS).
# --dedicated needs only built binaries: with cargo it builds them; without, it runs
# $OVERHEAD_BENCH_BIN (target/release/deps/overhead-*) against $OVERHEAD_TOKENTAP
# (target/release/tokentap), so both can be copied to another machine with this script.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr)"
which=${1:-all}
mode=${2:-}

# nginx and HAProxy are the baselines; the bench says "skipped" for one that is missing.
install_baselines() {
  local missing=()
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
  command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing ${missing[*]} (the baselines)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
        || echo "warning: could not install ${missing[*]}; their rows will say skipped"
    else
      echo "warning: ${missing[*]} not installed and cannot install here (needs root and apt-get); their rows will say skipped"
    fi
  fi
  # The packages start their services; the bench runs its own instances.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop nginx haproxy >/dev/null 2>&1 || true; fi
}

# The bench binary and the tokentap binary it runs: built here when cargo exists.
find_binaries() {
  if [ -z "${OVERHEAD_BENCH_BIN:-}" ] && command -v cargo >/dev/null 2>&1; then
    # jemalloc, as production builds: the idle-stream memory figures are of it.
    cargo build --release --features jemalloc --quiet
    OVERHEAD_BENCH_BIN=$(cargo bench --bench overhead --no-run --message-format=json 2>/dev/null \
      | grep -o '"executable":"[^"]*overhead[^"]*"' | tail -1 | cut -d'"' -f4)
  fi
  if [ -z "${OVERHEAD_BENCH_BIN:-}" ]; then
    OVERHEAD_BENCH_BIN=$(ls -t target/release/deps/overhead-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
  fi
  if [ -z "${OVERHEAD_BENCH_BIN:-}" ] || [ ! -x "$OVERHEAD_BENCH_BIN" ]; then
    echo "error: no overhead bench binary: build it with 'cargo bench --bench overhead --no-run' or set OVERHEAD_BENCH_BIN" >&2
    exit 2
  fi
  export OVERHEAD_TOKENTAP=${OVERHEAD_TOKENTAP:-$PWD/target/release/tokentap}
  if [ ! -x "$OVERHEAD_TOKENTAP" ]; then
    echo "error: no tokentap binary at $OVERHEAD_TOKENTAP: 'cargo build --release' or set OVERHEAD_TOKENTAP" >&2
    exit 2
  fi
}

# Disjoint core sets. With 8 or more cores: a quarter (at least 2) for the proxy under test, a
# quarter for the upstream, the rest for the client. With 2 to 7: the last core for the proxy
# alone, the others shared by upstream and client — the proxy's cores are still not shared with
# them, as the latency bars ask (SPEC §9), but the rest of the machine is busier. Returns 0 when
# the proxy has cores of its own and 1 on a single core; sets $full when the machine has 8+.
pin_cores() {
  local cores proxy upstream
  cores=$(nproc); full=0
  if [ "$cores" -ge 8 ]; then
    full=1
    proxy=$(( cores / 4 )); [ "$proxy" -ge 2 ] || proxy=2
    upstream=$proxy
    export OVERHEAD_PROXY_CPUS="0-$(( proxy - 1 ))"
    export OVERHEAD_UPSTREAM_CPUS="$proxy-$(( proxy + upstream - 1 ))"
    export OVERHEAD_CLIENT_CPUS="$(( proxy + upstream ))-$(( cores - 1 ))"
  elif [ "$cores" -ge 2 ]; then
    local rest="0-$(( cores - 2 ))"; [ "$cores" -gt 2 ] || rest=0
    export OVERHEAD_PROXY_CPUS="$(( cores - 1 ))"
    export OVERHEAD_UPSTREAM_CPUS="$rest"
    export OVERHEAD_CLIENT_CPUS="$rest"
    echo "note: $cores cores: the proxy gets core $OVERHEAD_PROXY_CPUS alone (one thread per proxy: tokentap's runtime, nginx's workers and HAProxy's threads follow its cores), upstream and client share the rest; 8 or more give each its own; the 10,000-stream run is paced to the 1,000-stream run's 20K events/s"
  else
    echo "warning: 1 core: cannot pin proxy, upstream and client apart; running shared — latency figures include their contention, and the 10,000-stream run is paced to the 1,000-stream run's 20K events/s"
    return 1
  fi
  echo "pinning: proxy cores $OVERHEAD_PROXY_CPUS, upstream cores $OVERHEAD_UPSTREAM_CPUS, client cores $OVERHEAD_CLIENT_CPUS"
  return 0
}

if [ "$which" = overhead ] && [ "$mode" = --dedicated ]; then
  install_baselines
  find_binaries
  pin_cores || true
  verdicts=$(mktemp); run_log=$(mktemp)
  for streams in 1000 10000; do
    interval=50; events=200
    # Fewer than 8 cores cannot carry 200K events/s: the 10,000 streams keep the 1,000-stream
    # run's 20K events/s and length in events per second of wall time (20 events every 500 ms).
    if [ "$full" = 0 ] && [ "$streams" = 10000 ]; then interval=500; events=20; fi
    idle=2000; held=0; rounds=${OVERHEAD_ROUNDS:-5}
    # The 10,000-stream run checks that they are held; the ratio is judged on the 1,000.
    if [ "$streams" = 10000 ]; then idle=0; held=10000; rounds=1; fi
    echo "== $streams streams × $events events, one every $interval ms =="
    OVERHEAD_STREAMS=$streams OVERHEAD_EVENTS=$events OVERHEAD_INTERVAL_MS=$interval OVERHEAD_IDLE=$idle OVERHEAD_HELD=$held \
      OVERHEAD_RAMP_MS=$(( streams )) OVERHEAD_ROUNDS=$rounds OVERHEAD_VERDICT=1 "$OVERHEAD_BENCH_BIN" > "$run_log" 2>/dev/null || true
    grep -v '^verdict' "$run_log" || true
    grep '^verdict' "$run_log" >> "$verdicts" || true
  done
  echo "== verdicts =="
  cat "$verdicts"
  rm -f "$verdicts" "$run_log"
  exit 0
fi

if [ "$which" = overhead ] && [ "$mode" = --ab ]; then
  old=${3:?usage: scripts/bench.sh overhead --ab OLD_TOKENTAP_BINARY}
  install_baselines
  find_binaries
  OVERHEAD_AB="A=$old,B=$OVERHEAD_TOKENTAP" OVERHEAD_ROUNDS=${OVERHEAD_ROUNDS:-5} OVERHEAD_HELD=0 \
    "$OVERHEAD_BENCH_BIN"
  exit 0
fi

if [ "$which" = all ] || [ "$which" = stream ]; then
  cargo bench --bench stream -- --warm-up-time 1 --measurement-time 5 2>&1 \
    | grep -E '^(scan|body)|time:|thrpt:|allocations per event'
fi
if [ "$which" = all ] || [ "$which" = overhead ]; then
  install_baselines
  cargo bench --bench overhead 2>&1 | grep -vE '^\s*(Compiling|Finished|Running)'
  OVERHEAD_INJECT=1 OVERHEAD_IDLE=10 OVERHEAD_HELD=0 cargo bench --bench overhead 2>&1 \
    | grep -E '^(overhead|\| 1 \||median)' | sed 's/^/[usage injected and stripped] /'
fi
