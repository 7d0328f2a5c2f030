#!/usr/bin/env bash
# Runs tokentap's benchmarks and prints the figures recorded in docs/benchmarks.md.
# Every figure is a ratio or a count measured against a baseline in the same run.
#   scripts/bench.sh            all benches
#   scripts/bench.sh stream     only the hot-path bench
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -sr)"
which=${1:-all}
if [ "$which" = all ] || [ "$which" = stream ]; then
  cargo bench --bench stream -- --warm-up-time 1 --measurement-time 5 2>&1 \
    | grep -E '^(scan|body)|time:|thrpt:|allocations per event'
fi
