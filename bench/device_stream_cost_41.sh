#!/usr/bin/env bash
# On the lent GPU, read-only: what the per-process stream costs the NVML reader (issue 41:
# at most 0.05 % of a core) with one CUDA process on the GPU (the utilisation call is not
# made: one process's activity is the device's), then with two (it is made).
# `bench/process_stream_cost.py --real` per case; its JSON lands in $OUT as
# process_stream_cost_<N>.json. Usage (carry .whl: the cp312 wheels the device lacks):
#     bash bench/device_stream_cost_41.sh [seconds per reader run, default 10]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/bench PYTHONUNBUFFERED=1
seconds=${1:-10}
for n in 1 2; do
    pids=()
    for _ in $(seq $n); do python3 bench/matmul_loop.py $(( 7 * ${seconds%.*} + 20 )) & pids+=($!); done
    sleep 6  # the loads' contexts up before the reader lists them
    echo "== $n CUDA process(es) on GPU 0"
    WATTLAB_BENCH_RESULTS=$OUT timeout 200 python3 bench/process_stream_cost.py --real \
        --seconds "$seconds" 2>&1 | tail -6
    mv "$OUT/process_stream_cost.json" "$OUT/process_stream_cost_$n.json"
    kill "${pids[@]}" 2>/dev/null; wait
done
echo "== CPU of each per-process call, two CUDA processes on GPU 0"
WATTLAB_BENCH_RESULTS=$OUT timeout 120 python3 bench/device_process_calls.py --loads 2 \
    --no-pauses 2>&1 | tail -12
