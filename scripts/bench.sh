#!/usr/bin/env bash
# Runs tokentap's benchmarks and prints the figures recorded in docs/benchmarks.md.
# Every figure is a ratio or a count measured against a baseline in the same run.
#   scripts/bench.sh            all benches
#   scripts/bench.sh stream     only the hot-path bench
#   scripts/bench.sh overhead   only the end-to-end bench (direct vs tokentap vs nginx)
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr)"
which=${1:-all}
if [ "$which" = all ] || [ "$which" = stream ]; then
  cargo bench --bench stream -- --warm-up-time 1 --measurement-time 5 2>&1 \
    | grep -E '^(scan|body)|time:|thrpt:|allocations per event'
fi
if [ "$which" = all ] || [ "$which" = overhead ]; then
  # nginx is the CPU baseline; the bench says "skipped" without it (apt-get install nginx-light).
  cargo bench --bench overhead 2>&1 | grep -vE '^\s*(Compiling|Finished|Running)'
  OVERHEAD_INJECT=1 OVERHEAD_IDLE=10 OVERHEAD_HELD=10 cargo bench --bench overhead 2>&1 \
    | grep -E '^overhead|through|added|CPU' | sed 's/^/[usage injected and stripped] /'
fi
