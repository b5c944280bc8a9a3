#!/usr/bin/env bash
# The default job's speed on one GPU in at most 8 minutes (python -m benchmarks.gpu_runs), for a lent GPU
# machine that has PyTorch and Lightning but no network and no jsonargparse: bring its three wheels in .whl/,
# made where the package registry is reachable:
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl \
#       jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.14.0
#   bash benchmarks/gpu_run.sh --plan          each step, its estimate, the total; exits 0 on any machine
#   bash benchmarks/gpu_run.sh RESULTS_DIR     the runs; RESULTS_DIR gets runs.json, environment.txt and a log
#                                              a run (its run folders and the inductor cache in RESULTS_DIR/work)
# From the device tool, with few files back: bash benchmarks/gpu_run.sh gpu-results; cp gpu-results/*.json
# gpu-results/*.txt gpu-results/*.log "$OUT"/
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ! python3 -c 'import jsonargparse' 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
exec python3 -m benchmarks.gpu_runs "$@"
