#!/usr/bin/env bash
# On the lent GPU, no meter: issue 37's end-to-end qualification in its short form (five
# 12 s windows a level, ~3.3 min), run twice as two separate commands. The GPU's own energy
# counter (read every 0.1 s) is the reference: what x says is agreement with the counter, not
# accuracy; the targets are its two NVML power views (1 s average, instant). Both JSONs and
# (compacted) run files land in $OUT; the two x % per target and their difference are
# printed (goal: they repeat within 0.2 points). Read-only on the card: matrix products only.
#     bash bench/device_qualify_37.sh          # both runs, one after the other
#     bash bench/device_qualify_37.sh 1        # run 1 alone (then `... 2` in another call;
#                                              # the repeat is compared where both JSONs are)
#     bash bench/device_qualify_37.sh full K L # MLPerf's full form, run K's level L alone
#                                              # (~5.3 min a call: idle, load1, load2 in three
#                                              # calls, then score the three files here:
#                                              # docs/qualify.md, "Recorded in parts")
# A rehearsal here, on the fake NVML's simulated GPU (0.5 s windows, ~25 s a run), with a
# python3 that has the project's dependencies first on PATH:
#     PATH=.venv/bin:$PATH SIMULATE=1 OUT=DIR bash bench/device_qualify_37.sh
set -u
if [ -z "${SIMULATE:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        || exit 1
    form=(--short); full=()
    export PYTHONPATH=/tmp/site:$PWD/src
    python3 -c "import torch; assert torch.cuda.is_available(); print('torch', torch.__version__)" \
        || python3 -c "import cupy; print('cupy', cupy.__version__)" || exit 1
else
    form=(--simulate --window-s 0.5); full=("${form[@]}")
    export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader \
    | tee "$OUT/gpu.txt" || echo "no nvidia-smi: ${SIMULATE:+rehearsal}"
if [ "${1:-}" = full ]; then
    k=${2:?run number} level=${3:?level: idle, load1 or load2}
    start=$(date +%s)
    timeout 420 python3 -m wattlab.cli qualify --gpu 0 --levels "$level" "${full[@]}" \
        -o "$work/raw_full_${k}_$level.h5" > "$OUT/full_${k}_$level.log" 2>&1
    echo "full form, run $k, $level: exit $? in $(( $(date +%s) - start )) s"
    tail -3 "$OUT/full_${k}_$level.log"
    python3 bench/compact_run.py "$work/raw_full_${k}_$level.h5" "$OUT/full_${k}_$level.h5"
    exit 0
fi
for k in ${@:-1 2}; do
    start=$(date +%s)
    timeout 290 python3 -m wattlab.cli qualify --gpu 0 "${form[@]}" -o "$work/raw_$k.h5" \
        --json > "$OUT/qualify_$k.json" 2> "$OUT/qualify_$k.log"
    echo "run $k: exit $? in $(( $(date +%s) - start )) s"; tail -3 "$OUT/qualify_$k.log"
    python3 bench/compact_run.py "$work/raw_$k.h5" "$OUT/qualify_$k.h5" && rm "$work/raw_$k.h5"
done
if [ -s "$OUT/qualify_1.json" ] && [ -s "$OUT/qualify_2.json" ]; then
    python3 bench/qualify_repeat.py "$OUT/qualify_1.json" "$OUT/qualify_2.json" \
        | tee "$OUT/repeat.txt"
fi
ls -la "$OUT"
