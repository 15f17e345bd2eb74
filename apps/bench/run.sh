#!/usr/bin/env bash
# `make bench`: the C++ and Python benchmarks, one after the other on the same
# machine, then docs/benchmarks.md and docs/benchmarks.png. Pass --quick for a smoke run.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=bench-out
mkdir -p "$out"
export OMP_NUM_THREADS=2
./build/apps/bench/torchattn_bench --threads 2 --json "$out/cpp.json" "$@"
.venv/bin/python apps/bench/bench_python.py --threads 2 --json "$out/py.json" "$@"
docs=docs
[ "${1:-}" = "--quick" ] && docs="$out"
.venv/bin/python apps/bench/report.py --cpp "$out/cpp.json" --py "$out/py.json" --out "$docs" >/dev/null
echo "bench: wrote $docs/benchmarks.md and $docs/benchmarks.png"
