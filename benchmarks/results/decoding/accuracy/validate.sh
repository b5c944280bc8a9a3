#!/usr/bin/env bash
# ./validate.sh FIT EVAL_CLONE: FIT's last.ckpt (runs/main/FIT) evaluated on the val folder by EVAL_CLONE's decoding
# -> runs/main/eval/FIT-on-EVAL_CLONE/ (validate.log, the checkpoint copied there: a run folder of its own)
set -euo pipefail
fit=$1 clone=$2
here=/work/decode_acc
out=$here/runs/main/eval/$fit-on-$clone
mkdir -p "$out"
cp "$here/runs/main/$fit/lightning_logs/version_0/checkpoints/last.ckpt" "$out/last.ckpt"
cd "$here/$clone"
/usr/bin/time -v /work/main/.venv/bin/python -m project validate --config configs/logger/csv.yaml \
  --ckpt_path="$out/last.ckpt" --trainer.default_root_dir="$out" --callbacks.progress_bar=false \
  > "$out/validate.log" 2>&1
