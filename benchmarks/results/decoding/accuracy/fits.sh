#!/usr/bin/env bash
# The fits, alternating draft/whole: seed 1 (draft was run first, alone), then seeds 2 and 3.
set -euo pipefail
cd /work/decode_acc && source opts.sh
for run in "whole 1" "draft 2" "whole 2" "draft 3" "whole 3"; do
  set -- $run
  echo "$(date +%T) start $1 seed $2"
  ./fit.sh "$1" "$2" "$EPOCHS" main "${OPTS[@]}"
  echo "$(date +%T) done $1 seed $2"
done
