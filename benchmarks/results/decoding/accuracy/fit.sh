#!/usr/bin/env bash
# One fit: ./fit.sh CLONE SEED EPOCHS TAG [OPTION...] -> runs/TAG/CLONE-sSEED/ (lightning_logs/version_0, fit.log)
set -euo pipefail
clone=$1 seed=$2 epochs=$3 tag=$4; shift 4  # the rest: more options, the same both ways
here=/work/decode_acc
out=$here/runs/$tag/$clone-s$seed
mkdir -p "$out"
cd "$here/$clone"
/usr/bin/time -v /work/main/.venv/bin/python -m project fit --config configs/logger/csv.yaml \
  --data=project.data.ImageFolderDataModule --data.data_dir=$here/data \
  --trainer.max_epochs="$epochs" --seed_everything="$seed" \
  --trainer.default_root_dir="$out" --callbacks.progress_bar=false "$@" > "$out/fit.log" 2>&1
