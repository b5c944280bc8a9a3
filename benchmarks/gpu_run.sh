#!/usr/bin/env bash
# The one GPU command. On a lent GPU machine that has PyTorch and Lightning but no network and no jsonargparse,
# bring jsonargparse's three wheels in .whl/, made where the package registry is reachable:
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl \
#       jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.14.0
#   bash benchmarks/gpu_run.sh --plan          each mode, its estimate, the total; exits 0 on any machine
#   bash benchmarks/gpu_run.sh RESULTS_DIR     the pairs (benchmarks/gpu_runs.py): the template, Lightning's bare
#                                              loop and the plain loop per mode, in at most 7 minutes; RESULTS_DIR
#                                              gets runs.json, gpu-run.log and environment.txt, nothing more
#   bash benchmarks/gpu_run.sh --check [ARGS]  every CUDA path of the template, pass or fail (benchmarks/gpu_check.py,
#                                              make gpu-check); --check --help lists its options
# From the device tool: bash benchmarks/gpu_run.sh "$OUT". PYTHON names the interpreter (default python3).
set -u
PYTHON=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ! "$PYTHON" -c 'import jsonargparse' 2>/dev/null && [ -d .whl ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
if [ "${1:-}" = "--check" ]; then
  shift
  exec "$PYTHON" -m benchmarks.gpu_check "$@"
fi
exec "$PYTHON" -m benchmarks.gpu_runs "$@"
