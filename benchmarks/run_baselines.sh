#!/usr/bin/env bash
# The baseline runs on the H200: the 100-shape CUDA-L2 sample, offline then server mode,
# baselines torch, cuBLAS NN/TN (and the better of the two), cuBLASLt heuristic and autotuning.
#
#   benchmarks/run_baselines.sh [OUT_ROOT] [SECONDS_PER_MODE] [extra gemmgen bench flags, e.g. --resume]
#
# Writes OUT_ROOT/baselines_sample100_{offline,server}/{results.json,speedup.png,buckets.png}
# (OUT_ROOT defaults to benchmarks/results). Each mode stops cleanly at its time budget
# (default 115 s); rerun with --resume to finish what a budget cut off.
set -uo pipefail
root=${1:-benchmarks/results}
budget=${2:-115}
shift $(( $# > 2 ? 2 : $# ))
status=0
for mode in offline server; do
  python3 -m gemmgen bench --shapes benchmarks/shapes/cudal2_sample100.csv --mode "$mode" \
    --baselines torch,cublas,lt_heuristic,lt_autotune \
    --out "$root/baselines_sample100_$mode" --time-budget "$budget" --no-progress "$@" || status=$?
done
exit $status
