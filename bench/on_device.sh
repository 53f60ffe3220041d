#!/usr/bin/env bash
# Everything wattlab measures on a lent GPU machine, in one call (read-only on the card).
# The machine cannot fetch packages: wheels travel in .whl/ (see BENCHMARKS.md, "NVML
# readers side by side"); wattlab itself runs from src/.
set -uo pipefail
# The device's copy of the tree has no git history of ours: rows must name the commit.
: "${WATTLAB_COMMIT:?set WATTLAB_COMMIT=<sha of the commit you run> (git rev-parse --short HEAD)}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/bench PYTHONUNBUFFERED=1
# each result straight to $OUT: what finished comes back even if the call runs out of time
export WATTLAB_BENCH_RESULTS="${OUT:-$PWD/bench/results}"
# $OUT returns a limited number of files: after each step keep only the JSON results there
# (run files, traces and logs would crowd them out); a local run keeps everything
keep_results() { if [ -n "${OUT:-}" ]; then find "$OUT" -type f ! -name '*.json' -delete; fi; }
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv
echo "== issue 2: wattlab record --nvml 0 under a matmul load"
WATTLAB_DEVICE=1 python3 -m pytest -q -s -p no:cacheprovider tests/with_device 2>&1 | tail -25
keep_results
echo "== issue 10: NVML readers side by side"
python3 bench/nvml_compare.py
keep_results
echo "== issue 10: where the reader's CPU goes"
python3 bench/nvml_cost.py --seconds 30
keep_results
echo "== the energy counter's update grid, and sweep-paced reads placed on it"
python3 bench/counter_grid.py --seconds 20 --late-ms 10
keep_results
