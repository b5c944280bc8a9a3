#!/usr/bin/env bash
# Every GPU measurement of the template in one command, also for a GPU machine that has PyTorch and
# Lightning but no network: it runs with that machine's python3, and where jsonargparse and its two
# helpers are missing there, bring them as wheels in .whl/, made where the package registry is reachable:
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl \
#       jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.14.0
# Then, on the GPU machine, in the repository's root:
#   bash benchmarks/gpu_run.sh OUT STAGE...
# Stages, each writing its report under OUT/<stage>/ and its output to OUT/<stage>.log:
#   check    python -m benchmarks.gpu_check: every CUDA path, 4 at a time
#   job      python -m benchmarks.gpu_job: configs/default.yaml's job, default input and loader, fp32/bf16
#   job-resnet50  the same for its ResNet50 runs only: bf16, fp32 and bf16 compiled (one call's worth); into
#            OUT/job/ as job writes (gpu_job keeps the runs a report there already holds)
#   profile  python -m benchmarks.gpu_job --profile: 5 steps of three of its runs under the profiler
#   timing   python -m benchmarks.timing_cost: the timing callback off / on / synchronising every step
#   overhead python -m benchmarks.overhead: training, template vs plain PyTorch on this GPU
#   inference python -m benchmarks.inference: test and predict, likewise
#   bench    python -m project bench --config configs/bench/gpu1.yaml; its tables from the finished cells
#   bench-mobilenet_v2, bench-resnet50   the same matrix for one network only (half of it, to fit one call);
#            the two halves' cells, brought back from two calls, make the whole table with `project compare`
# On one H100: check about 2 minutes, job about 7 for the five of its runs timed (6.6; ResNet50 fp32 and
# compiled not yet: job-resnet50 runs its three ResNet50 runs in a call of their own); bench about 15, estimated
# from its MobileNetV2 cells (95-147 s each; no ResNet50 cell has run); profile, timing, overhead and
# inference not run yet (estimated 2-10 minutes each).
# A stage is not started after DEADLINE_S seconds (default 540), and each is stopped at it, so the whole
# command ends inside a 10-minute limit; the runs' folders are kept in OUT/runs/, and every report is
# printed last. Exit status 0 when every stage ran to its end with status 0.
set -u
if [ $# -lt 2 ]; then
  echo "usage: bash benchmarks/gpu_run.sh OUT STAGE... (stages: check job job-resnet50 profile timing overhead" \
    "inference bench bench-mobilenet_v2 bench-resnet50)" >&2
  exit 2
fi
out=$(realpath -m "$1")
shift
deadline=${DEADLINE_S:-540}
runs=$out/runs

q() { printf '%q ' "$@"; }  # the words quoted for bash -c, whatever OUT's path holds

stage_command() {
  case $1 in
    check) q python3 -m benchmarks.gpu_check --out "$out/check" --runs "$runs/check" --jobs 4 --timeout-minutes 3 ;;
    job) q python3 -m benchmarks.gpu_job --out "$out/job" --runs "$runs/job" ;;
    job-resnet50) q python3 -m benchmarks.gpu_job --out "$out/job" --runs "$runs/job" --only 1,5,6 ;;
    timing) q python3 -m benchmarks.timing_cost --out "$out/timing" ;;
    overhead) q python3 -m benchmarks.overhead --out "$out/overhead" ;;
    inference) q python3 -m benchmarks.inference --out "$out/inference" ;;
    profile) q python3 -m benchmarks.gpu_job --profile --max-epochs 1 --only 0,1,3 --out "$out/profile" \
      --runs "$runs/profile" ;;
    bench) q python3 -m project bench --config configs/bench/gpu1.yaml --out "$runs/bench" ;;
    bench-mobilenet_v2 | bench-resnet50)  # gpu1.yaml with its archs line naming one network (checked: not all)
      local arch=${1#bench-} half="$out/gpu1-${1#bench-}.yaml"
      echo "$(q sed "s/^archs: .*/archs: [$arch]/" configs/bench/gpu1.yaml) > $(q "$half") &&" \
        "$(q grep -q "^archs: \[$arch\]\$" "$half") &&" \
        "$(q python3 -m project bench --config "$half" --out "$runs/bench")" ;;
    *) echo "gpu_run: unknown stage $1; choose from check job job-resnet50 profile timing overhead inference" \
      "bench bench-mobilenet_v2 bench-resnet50" >&2; return 1 ;;
  esac
}

for stage in "$@"; do  # every stage known before any runs
  stage_command "$stage" > /dev/null || exit 2
done
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c 'import jsonargparse' 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c 'import sys, torch, lightning, torchvision; print(sys.version.split()[0], "torch", torch.__version__,
"lightning", lightning.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda)'
} > "$out/environment.txt" 2>&1


status=0  # 1 when a stage failed, was stopped at the deadline, or did not start
for stage in "$@"; do
  command=$(stage_command "$stage")
  left=$((deadline - SECONDS))
  if [ "$left" -le 20 ]; then
    echo "gpu_run: $stage not started: the deadline (${deadline} s) is reached" | tee -a "$out/skipped.txt"
    status=1
    continue
  fi
  mkdir -p "$out/$stage"
  echo "gpu_run: $stage (at ${SECONDS} s, ${left} s left): $command"
  timeout -k 10 "$left" bash -c "$command" > "$out/$stage.log" 2>&1
  code=$?
  echo "gpu_run: $stage exit $code at ${SECONDS} s"
  [ "$code" -eq 0 ] || status=1
  if [ "${stage%%-*}" = bench ]; then  # its tables, also when cells failed or the deadline cut it: the finished cells'
    python3 -m project compare --out "$out/bench" "$runs/bench/runs" > "$out/bench-compare.log" 2>&1
  fi
done

cat "$out/environment.txt"
for report in "$out"/*/*.md; do
  if [ -f "$report" ]; then echo; echo "==== $report"; cat "$report"; fi
done
exit "$status"
