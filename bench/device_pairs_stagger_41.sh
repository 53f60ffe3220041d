#!/usr/bin/env bash
# On the lent GPU (carry .whl): tests/with_device/shared_gpu.py's pairs under `wattlab record
# --nvml 0` with the shared runs staggered (`pairs --stagger F`, default 0.5): the workload
# that took less time alone is released first and works alone for F of that time, with the
# other's context live beside it, so the rule has a lone stretch of the shared run itself.
# A second argument multiplies every workload's work (`--scale K`).
# The compacted run file lands in $OUT; split it here with
#     python bench/shared_gpu_attribution.py $OUT/pairs_stagger.h5
# Read-only on the card: it only runs kernels and reads.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    2>&1 | grep -v "^WARNING: Target" ; export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
work=$(mktemp -d)
timeout 400 python3 -m wattlab.cli record --nvml 0 -o "$work/pairs.h5" -- python3 \
    tests/with_device/shared_gpu.py pairs --stagger "${1:-0.5}" --scale "${2:-1}" > "$OUT/pairs_stagger.log" 2>&1
echo "pairs exit $?"; tail -12 "$OUT/pairs_stagger.log"
python3 bench/compact_run.py "$work/pairs.h5" "$OUT/pairs_stagger.h5"
ls -la "$OUT"
