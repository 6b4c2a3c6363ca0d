#!/usr/bin/env bash
# The README's first command: install dependencies and build, fetch SmolLM2-135M-Instruct (GGUF)
# and the perlfaq Q/A data, then LoRA-fine-tune on 4 MPI ranks (FSDP2, dp 4).
# Outputs under out/smollm2_lora_perlfaq/: step_N checkpoints, metrics.jsonl, loss.png and the
# PEFT adapter directory adapter/. Extra arguments go to dtr-train (e.g. --set step_scheduler.max_steps=30).
# NP=3 with --set distributed.dp_size=1 --set distributed.tp_size=3 runs tensor parallel instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bash scripts/fetch-model.sh
bash scripts/fetch-data.sh
NP="${NP:-4}"
ROOT_FLAG=()
[ "$(id -u)" -eq 0 ] && ROOT_FLAG=(--allow-run-as-root)
exec mpirun -np "$NP" --oversubscribe "${ROOT_FLAG[@]}" build/bin/dtr-train \
  --config configs/smollm2_lora_perlfaq.yaml "$@"
