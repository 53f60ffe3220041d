set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
python3 -c "import numpy, scipy, matplotlib; print(numpy.__version__, scipy.__version__)"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
python3 -c "import transformers, torch; print(transformers.__version__, torch.__version__)"
cd /tmp
timeout 280 python3 -m wattlab.cli record --nvml 0 -o $OUT/pairs.h5 -- python3 $OLDPWD/tests/with_device/shared_gpu.py pairs > $OUT/pairs.log 2>&1; echo "pairs exit $?"; tail -30 $OUT/pairs.log
timeout 150 python3 -m wattlab.cli record --nvml 0 -o $OUT/serve_shared.h5 -- python3 $OLDPWD/tests/with_device/serving_job.py --port 18777 --log $OUT/serve_shared.jsonl > $OUT/serve_shared.log 2>&1; echo "shared exit $?"; tail -5 $OUT/serve_shared.log
timeout 150 python3 -m wattlab.cli record --nvml 0 -o $OUT/serve_excl.h5 -- python3 $OLDPWD/tests/with_device/serving_job.py --port 18778 --exclusive --log $OUT/serve_excl.jsonl > $OUT/serve_excl.log 2>&1; echo "excl exit $?"; tail -5 $OUT/serve_excl.log
ls -la $OUT
