#!/usr/bin/env bash
# On the lent GPU (carry .whl), read-only: issue 41 with every driver sample read
# (`--nvml-intervals processes=0.15`): what the whole per-process stream then costs the NVML
# reader with two CUDA processes sharing GPU 0 (`bench/process_stream_cost.py --real --every
# 0.15`: measured, where it was computed from one call's CPU), and
# tests/with_device/shared_gpu.py's pairs recorded so (the reader asks for the utilisation at
# the two reads after the GPU was last shared). The compacted run file lands in $OUT; split it
# here with `python bench/shared_gpu_attribution.py $OUT/pairs_every.h5`. Usage:
#     bash bench/device_every_sample_41.sh [seconds per reader run, default 10]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    2>&1 | grep -v "^WARNING: Target" ; export PYTHONPATH=/tmp/site:$PWD/src:$PWD/bench PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
seconds=${1:-10}
pids=()
for _ in 1 2; do python3 bench/matmul_loop.py $(( 7 * ${seconds%.*} + 20 )) & pids+=($!); done
sleep 6  # the loads' contexts up before the reader lists them
echo "== the stream read every 0.15 s, two CUDA processes on GPU 0"
WATTLAB_BENCH_RESULTS=$OUT timeout 200 python3 bench/process_stream_cost.py --real \
    --seconds "$seconds" --every 0.15 2>&1 | tail -6
kill "${pids[@]}" 2>/dev/null; wait
work=$(mktemp -d)
timeout 300 python3 -m wattlab.cli record --nvml 0 --no-live --nvml-intervals processes=0.15 \
    -o "$work/pairs.h5" -- python3 tests/with_device/shared_gpu.py pairs > "$OUT/pairs_every.log" 2>&1
echo "pairs exit $?"; tail -8 "$OUT/pairs_every.log"
python3 bench/compact_run.py "$work/pairs.h5" "$OUT/pairs_every.h5"
ls -la "$OUT"
