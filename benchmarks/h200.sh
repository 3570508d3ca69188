#!/usr/bin/env bash
# Runs on the H200 device machine, from the repository root: installs the carried wheels
# (.whl/, made by ../shared/gpu/fetch-wheels) and the package, then each step given as an
# argument (a shell command, usually under `timeout`), logging to $OUT/log.txt. At the end it
# packs $PACK (default: benchmarks/results and tuning_db/shipped; name the steps' own folders to
# bring back less) into $OUT/results.tgz, since only a few files come back from that machine.
set -uo pipefail
export PYTHONUNBUFFERED=1 GEMMGEN_CACHE_DIR=${GEMMGEN_CACHE_DIR:-/tmp/gemmgen-cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/log.txt"
for step in "$@"; do
  echo "=== $(date -u +%H:%M:%S) $step" | tee -a "$OUT/log.txt"
  start=$(date +%s)
  bash -c "$step" 2>&1 | tee -a "$OUT/log.txt" | tail -n 60
  echo "=== rc=${PIPESTATUS[0]} in $(( $(date +%s) - start )) s" | tee -a "$OUT/log.txt"
done
tar czf "$OUT/results.tgz" ${PACK:-benchmarks/results tuning_db/shipped} 2>/dev/null
