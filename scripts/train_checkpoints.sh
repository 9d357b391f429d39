#!/usr/bin/env bash
# Train (or resume) the shipped checkpoints from their recipes and export each to checkpoints/NAME.
#   scripts/train_checkpoints.sh NAME [NAME ...]
# Each run resumes from runs/NAME/checkpoints/last.ckpt when one exists; logs go to runs/NAME/.
set -euo pipefail
cd "$(dirname "$0")/.."
ZOO="${ZOO:-.venv/bin/zoo}"
for name in "$@"; do
  ckpt_dir="runs/$name/checkpoints"
  resume=()
  [ -f "$ckpt_dir/last.ckpt" ] && resume=(--ckpt_path last --weights_only true)
  mkdir -p "runs/$name"
  start=$(date +%s)
  "$ZOO" fit --config "configs/$name.yaml" "${resume[@]}" >> "runs/$name/train.log" 2>&1
  end=$(date +%s)
  # Wall time adds up over resumed runs.
  previous=$(cat "runs/$name/wall_seconds" 2>/dev/null || echo 0)
  echo $((previous + end - start)) > "runs/$name/wall_seconds.tmp" && mv "runs/$name/wall_seconds.tmp" "runs/$name/wall_seconds"
  "$ZOO" export "$ckpt_dir/last.ckpt" "checkpoints/$name" >> "runs/$name/train.log" 2>&1
  echo "$name done in $((end - start)) s"
done
