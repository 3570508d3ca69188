#!/usr/bin/env bash
# Tune on the H200 and ship the winners: the 100-shape sample first, then as much of the
# 1,000 set as the time budget allows (resumable: run it again in the next GPU session).
# Usage: benchmarks/tune_h200.sh [SAMPLE_SECONDS] [FULL_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SAMPLE_S=${1:-420}
FULL_S=${2:-0}
python benchmarks/tune_h200.py --shapes benchmarks/shapes/cudal2_sample100.csv \
    --out benchmarks/results/tune_h200 --time-budget "$SAMPLE_S" --budget 6
if [ "$FULL_S" != "0" ]; then
    python benchmarks/tune_h200.py --shapes benchmarks/shapes/cudal2_1000.csv \
        --out benchmarks/results/tune_h200 --time-budget "$FULL_S" --budget 4
fi
