#!/usr/bin/env bash
# On the lent GPU, read-only: issue 41's per-process stream on real hardware.
#  1. `record --nvml 0` around a bf16 matmul process: rows of its pid with SM% > 0, its
#     `process` marker (what tests/with_device/test_process_stream.py checks, without pytest:
#     the device has no hypothesis for the suite's conftest);
#  2. what the stream costs the reader (`bench/process_stream_cost.py --real`, a CUDA load on);
#  3. the four pairs of tests/with_device/shared_gpu.py re-recorded with the stream, and
#     `energy --by-process` (activity and Kepler's rule) on them.
# Everything lands in $OUT. Usage (carry .whl: the wattlab wheel plus cp312 wheels):
#     bash bench/device_processes_41.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/bench PYTHONUNBUFFERED=1
repo=$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
load=("$repo/bench/matmul_loop.py")  # a CUDA process: bf16 products for SECONDS
cd /tmp
echo "== 1. one CUDA process under record"
timeout 120 python3 -m wattlab.cli record --nvml 0 --no-live -o "$OUT/one.h5" -- \
    python3 "${load[@]}" 6 --pid-file /tmp/pid > "$OUT/one.log" 2>&1; echo "record exit $?"
tail -12 "$OUT/one.log"
python3 - "$OUT/one.h5" /tmp/pid <<'PY'
import sys, numpy as np, wattlab
pid = int(open(sys.argv[2]).read())
with wattlab.open(sys.argv[1]) as run:
    s = run.source("gpu0.processes")
    mine = s.channel("pid") == pid
    sm = s.channel("sm_util_pct")[mine]
    marks = [m.payload for m in run.markers if m.name == "process" and m.payload["pid"] == pid]
    print(f"pid {pid}: {int(mine.sum())} rows, SM% max {np.nanmax(sm) if sm.size else 'none'}; "
          f"all rows {len(s.channel('pid'))}; identity {marks}")
    print("CHECK", "ok" if mine.sum() and np.nanmax(sm) > 0 and marks else "FAILED")
PY
python3 -m wattlab.cli energy "$OUT/one.h5" --by-process 2>&1 | tail -8
echo "== 2. what the stream costs the reader (a CUDA load running)"
python3 "${load[@]}" 45 --pid-file /tmp/pid2 & loadpid=$!
sleep 3
WATTLAB_BENCH_RESULTS=$OUT timeout 200 python3 "$repo/bench/process_stream_cost.py" --real \
    --seconds 10 2>&1 | tail -12
wait $loadpid
echo "== 3. pairs with the stream"
timeout 300 python3 -m wattlab.cli record --nvml 0 --no-live -o "$OUT/pairs.h5" -- \
    python3 "$repo/tests/with_device/shared_gpu.py" pairs > "$OUT/pairs.log" 2>&1
echo "pairs exit $?"; tail -6 "$OUT/pairs.log"
for rule in activity utilisation; do
    python3 -m wattlab.cli energy "$OUT/pairs.h5" --by-process --rule $rule --json \
        > "$OUT/pairs_$rule.json" 2>> "$OUT/pairs.log"; echo "energy $rule exit $?"
    python3 -m wattlab.cli energy "$OUT/pairs.h5" --by-process --rule $rule 2>&1 | tail -14
done
ls -la "$OUT"
