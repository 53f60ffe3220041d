#!/usr/bin/env bash
# Records the real training traces the analyses are tested on (read-only on the card):
# each job of tests/with_device/training_jobs.py under `wattlab record --nvml 0
# --auto-markers`, into one tarball in $OUT (or bench/results/traces.tar.gz locally).
#     WATTLAB_COMMIT=<sha> bash bench/record_traces.sh ["JOB --steps N" ...]
set -uo pipefail
: "${WATTLAB_COMMIT:?set WATTLAB_COMMIT=<sha of the commit you run>}"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
dest="${OUT:-$PWD/bench/results}"
work=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.sm --format=csv
# the jobs to record: the arguments, or the set the iteration tests were first built on
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=("torch-long --steps 40" "torch-medium --steps 150" \
    "torch-short --steps 2000" "lightning --steps 48" "hf-trainer --steps 48" \
    "square-1hz --steps 30")
for spec in "${specs[@]}"; do
    name=${spec%% *}
    echo "== $name"
    timeout 150 python3 -m wattlab.cli record --nvml 0 --auto-markers -o "$work/$name.h5" \
        -- python3 tests/with_device/training_jobs.py $spec > "$work/$name.log" 2>&1
    echo "exit $?"; tail -5 "$work/$name.log"
    python3 -m wattlab.cli info "$work/$name.h5" 2>&1 | head -30
done
echo "$WATTLAB_COMMIT" > "$work/COMMIT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$work/GPU"
tar -C "$work" -czf "$dest/traces.tar.gz" .
ls -la "$work" "$dest"
