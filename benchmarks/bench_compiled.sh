#!/usr/bin/env bash
# Benchmark gemmgen.compile's kernels against every baseline (gemmgen bench, candidate "gemmgen"),
# reading the shipped H200 winners (GEMMGEN_DB may lay a working database over them).
# Usage: benchmarks/bench_compiled.sh SHAPES.csv NAME [MODE] [SECONDS] [extra gemmgen bench args]
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPES=${1:?shapes csv}; NAME=${2:?result name}; MODE=${3:-offline}; BUDGET=${4:-480}
shift 4 || shift $#
# build the chosen kernels on every core first, so no trial spends its time limit compiling
python -c "import sys; from gemmgen.compile import prebuild; from gemmgen.cli.tune import tune_problems; \
print('prebuild:', prebuild(tune_problems(sys.argv[1])))" "$SHAPES"
gemmgen bench --shapes "$SHAPES" --candidates gemmgen --mode "$MODE" --resume \
    --out "benchmarks/results/$NAME" --time-budget "$BUDGET" "$@"
