#!/usr/bin/env bash
# ./predict.sh FIT EVAL_CLONE: predictions.csv of FIT's last.ckpt on the val folder, decoded by EVAL_CLONE
# -> runs/main/eval/FIT-on-EVAL_CLONE/predict/ (per-image predictions, to count the images whose class changes)
set -euo pipefail
fit=$1 clone=$2
here=/work/decode_acc
out=$here/runs/main/eval/$fit-on-$clone
mkdir -p "$out/predict"
[ -f "$out/last.ckpt" ] || cp "$here/runs/main/$fit/lightning_logs/version_0/checkpoints/last.ckpt" "$out/last.ckpt"
cd "$here/$clone"
/usr/bin/time -v /work/main/.venv/bin/python -m project predict --ckpt_path="$out/last.ckpt" --data.test_folder=val \
  --trainer.default_root_dir="$out/predict" --callbacks.progress_bar=false > "$out/predict.log" 2>&1
