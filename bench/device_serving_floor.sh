#!/usr/bin/env bash
# On the lent GPU, read-only: issue 40's serving check (a real generation server scraped at
# 10 Hz, shared then one request at a time, compared by bench/serving_shares.py), what the
# scrape costs on the lent host (bench/scrape_cost.py) and issue 39's NVML floor
# (bench/nvml_floor.py). Everything lands in $OUT/serving.tar.gz and results.tar.gz
# (compacted run files, logs, JSON).
#     bash bench/device_serving_floor.sh [floor seconds: 0 runs the serving part alone]
# A rehearsal here, on the simulated GPU and the CPU: SIMULATE=1 OUT=DIR bash bench/...
set -u
if [ -z "${SIMULATE:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        || exit 1
    gpu=(--nvml 0); small=(); floor=(--seconds "${1:-60}")
    export PYTHONPATH=/tmp/site:$PWD/src
else
    gpu=(--simulate); small=(--device cpu --layers 1 --width 64 --heads 2 --vocab 100
           --prompt-tokens 16:64 --output-tokens 4:16 --requests 16 --rate-hz 20 --idle-s 1.5)
    floor=(--simulate --seconds 2 --runs 1)
    export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
repo=$PWD; work=$(mktemp -d); cd "$work"
w() { python3 -m wattlab.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee gpu.txt \
    || echo "no nvidia-smi: ${SIMULATE:+rehearsal}" 
# Both runs: the server is up, warmed up, before the recording (its scraper needs it, and
# its warm-up is not idle); the recording's load hands it the marker bus in the start file
# and waits for its log. shared: staggered requests; excl: one at a time, each marked.
job=("$repo/tests/with_device/serving_job.py" "${small[@]}")
serve() {  # mode port [job options]: expected on the lent H200 ~40 s shared, ~2.5 min excl
    local mode=$1 port=$2; shift 2
    python3 "${job[@]}" --port "$port" --log $mode.jsonl --start-file go_$mode "$@" \
        > server_$mode.log 2>&1 &
    local server=$!
    until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/metrics')" \
        2>/dev/null; do sleep 0.5; kill -0 $server || break; done
    timeout 300 python3 -m wattlab.cli record "${gpu[@]}" --no-live \
        --scrape http://127.0.0.1:$port/metrics --scrape-hz 10 -o raw_$mode.h5 -- \
        sh -c "echo \"\$WATTLAB_BUS\" > go_$mode.part && mv go_$mode.part go_$mode
               until [ -e $mode.jsonl ]; do sleep 0.2; done" > $mode.log 2>&1
    echo "$mode record exit $?"; kill $server; wait $server; tail -4 $mode.log
    tail -3 server_$mode.log
}
serve shared 18706
serve excl 18704 --exclusive
for mode in shared excl; do
    w import requests $mode.jsonl --into raw_$mode.h5 >> $mode.log 2>&1; echo "import exit $?"
    w energy raw_$mode.h5 --per tokens --json > per_tokens_$mode.json 2>> $mode.log
    echo "per exit $?"
    w energy raw_$mode.h5 --by-request --json > by_request_$mode.json 2>> $mode.log
    echo "by-request exit $?"
    w energy raw_$mode.h5 --per tokens 2>&1 | tail -8
    python3 "$repo/bench/compact_run.py" raw_$mode.h5 serve_$mode.h5 > /dev/null \
        && rm raw_$mode.h5
done
WATTLAB_BENCH_RESULTS=$work python3 "$repo/bench/serving_shares.py" serve_shared.h5 \
    serve_excl.h5 2>&1 | tail -8
WATTLAB_BENCH_RESULTS=$work timeout 100 python3 "$repo/bench/scrape_cost.py" \
    ${SIMULATE:+--quick} 2>&1 | tail -8
# what the serving part left comes back even if the floor runs past the command's limit
tar -C "$work" -czf "$OUT/serving.tar.gz" . && ls -la "$OUT"
[ "${1:-60}" = 0 ] && exit 0  # floor seconds 0: the serving part alone
cd "$repo" && timeout 330 python3 bench/nvml_floor.py --out "$work/floor" "${floor[@]}" \
    > "$work/floor.log" 2>&1; echo "floor exit $?"; tail -40 "$work/floor.log"
rm -f "$work"/floor/*.h5
tar -C "$work" -czf "$OUT/results.tar.gz" . && ls -la "$OUT"
