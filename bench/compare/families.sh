#!/usr/bin/env bash
# dtr vs PyTorch on the model families (issue 18): one LoRA training step of Gemma 3 270M and of
# Qwen3-0.6B, dtr-bench train-step --model beside transformers' own Gemma3ForCausalLM /
# Qwen3ForCausalLM (sdpa, peft LoRA) built from the config.json dtr resolved, alternately, on the
# same shape and threads; tokens/s ratio, MFU against the SGEMM peak, peak RSS
# (bench/compare/README.md, "Families"). The scenarios gemma3, qwen3 of run.sh with these defaults:
#
#   bash bench/compare/families.sh [run.sh flags, e.g. --reps 3 --seq 1024 --batch 1]
#
# Defaults: --reps 2 --seq 256 --batch 1 --steps 2 --warmup 1, Gemma 3 all 18 layers (from
# data/gemma3-270m-q4_k_m.gguf's metadata when present, else configs/gemma3_270m.json, written
# from it), Qwen3-0.6B (configs/qwen3_0.6b.json, HF's config) cut to its first QWEN3_LAYERS = 8
# of 28 layers, so that the run fits quiet_window.sh's 4 minutes on 2 cores (there it reuses the
# window's peak: --peak-json, and appends to its table: --raw --no-report). Later flags override
# these; environment as run.sh (GEMMA3_LAYERS, QWEN3_LAYERS, GEMMA3_MODEL, QWEN3_MODEL, FAMILY_PY;
# OUT_DIR default out/bench/families; DTR_BENCH_VENV default /work/.venv-ref when it exists).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
case "${1:-}" in -h|--help) sed -n '2,16p' "$0"; exit 0 ;; esac
export QWEN3_LAYERS=${QWEN3_LAYERS:-8} OUT_DIR=${OUT_DIR:-$HERE/../../out/bench/families}
ROOT="$(cd "$HERE/../.." && pwd)"
source "$HERE/bench_env.sh"  # DTR_BENCH_VENV for run.sh
exec bash "$HERE/run.sh" --scenarios gemma3,qwen3 --reps 2 --seq 256 --batch 1 --steps 2 --warmup 1 "$@"
