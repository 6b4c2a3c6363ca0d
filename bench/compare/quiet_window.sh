#!/usr/bin/env bash
# Every figure of README "Results" in one run on a quiet machine (<= 22 minutes on 2 cores):
#
#   bash bench/compare/quiet_window.sh [--only main,dp4,seq,layers30,recipe,others] [--dry-run]
#
# Sections (each prints its start time; the elapsed time of each is in the summary):
#   main      run.sh lora,full,dp, 3 reps (8 layers, seq 256, batch 4): measures the SGEMM peak,
#             the theoretical FMA peak (dtr-bench cpu-peak) and the GEMM table (dtr-bench gemm:
#             dtr's AVX-512 and AVX2 kernels beside raw Eigen)                        ~6 min
#   dp4       run.sh dp4 (4 ranks x 1 thread, LoRA), 1 rep: comm_exposed at dp 4       ~1.5 min
#   seq       LoRA at seq 256 / 512 / 1024 / 2048 with batch 8 / 4 / 2 / 1 (2048 tokens per
#             step), 1 rep each: tokens/s, peak RSS, attention's share                ~2.5 min
#   layers30  LoRA on the full 30-layer SmolLM2 shape, 1 rep                             ~1.5 min
#   recipe    the real recipe (configs/smollm2_lora_perlfaq.yaml, 4 ranks, FSDP2, the real
#             model and data) through dtr-train, 5 steps, no checkpoint / validation    ~1.5 min
#   others    the other bench/compare scripts that exist: families.sh (Gemma 3 / Qwen3 rows,
#             into this table), head.sh (262k-vocabulary head), moe.sh, each under its own
#             limit (250 / 170 / 120 s) and skipped if it would pass BUDGET_S (1320 s)  <= 9 min
# One table: out/bench/quiet-<date>.{md,json} (report.py), raw rows in quiet-<stamp>.jsonl, logs
# next to it. Environment: DTR_BUILD_DIR (default build/, dtr-bench and dtr-train must be built:
# nothing is built here), DTR_BENCH_VENV (default /work/.venv-ref when it imports torch, else
# run.sh's default), OUT_DIR (default out/bench).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/bench/compare"
die() { echo "quiet_window.sh: error: $*" >&2; exit 1; }
ONLY=main,dp4,seq,layers30,recipe,others DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
BUILD_DIR=${DTR_BUILD_DIR:-$ROOT/build}
export DTR_BUILD_DIR=$BUILD_DIR
if [ -z "${DTR_BENCH_VENV:-}" ] && /work/.venv-ref/bin/python -c 'import torch' >/dev/null 2>&1; then
  export DTR_BENCH_VENV=/work/.venv-ref
fi
PY=${DTR_BENCH_VENV:-/tmp/dtr-bench-venv}/bin/python
OUT_DIR=${OUT_DIR:-$ROOT/out/bench}
export OUT_DIR
for b in dtr-bench dtr-train; do [ -x "$BUILD_DIR/bin/$b" ] || die "$BUILD_DIR/bin/$b not built (ninja -C $BUILD_DIR $b)"; done
mkdir -p "$OUT_DIR"
STAMP=$(date -u +%Y%m%d-%H%M%S)
RAW="$OUT_DIR/quiet-$STAMP.jsonl"
: >"$RAW"
PEAK="${RAW%.jsonl}.peak.json"
T0=$(date +%s)
SUMMARY=()
has() { [[ ",$ONLY," == *",$1,"* ]]; }
# section <name> <command...>: runs it (or prints it with --dry-run) and records its duration.
section() {
  local name=$1 t
  shift
  t=$(date +%s)
  echo "== [$(date -u +%H:%M:%S), +$(( t - T0 ))s] $name: $*"
  if [ "$DRY" = 1 ]; then return 0; fi
  if "$@"; then SUMMARY+=("$name $(( $(date +%s) - t ))s")
  else SUMMARY+=("$name FAILED after $(( $(date +%s) - t ))s"); echo "quiet_window.sh: $name failed (continuing)" >&2
  fi
}
RUN=(bash "$HERE/run.sh" --no-build --raw "$RAW" --no-report)
logged() { local log=$1; shift; "$@" >"$log" 2>&1; }  # logged <file> <command...>

echo "quiet window: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg);" \
     "dtr $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); raw $RAW"

has main && section main "${RUN[@]}" --scenarios lora,full,dp --reps 3
if [ ! -s "$PEAK" ] && [ "$DRY" = 0 ]; then
  # Without `main` the peaks and the GEMM table are still measured once (run.sh, zero reps).
  section peak "${RUN[@]}" --scenarios lora --reps 0
  [ -s "$PEAK" ] || die "measuring the SGEMM peak failed"
fi
P=(--peak-json "$PEAK")
has dp4 && section dp4 "${RUN[@]}" "${P[@]}" --scenarios dp4 --reps 1 --steps 3 --warmup 1
if has seq; then
  for s in 256 512 1024 2048; do
    section "seq$s" "${RUN[@]}" "${P[@]}" --scenarios lora --reps 1 --seq "$s" --batch $(( 2048 / s )) --steps 2 --warmup 1 --tag "seq$s"
  done
fi
has layers30 && section layers30 "${RUN[@]}" "${P[@]}" --scenarios lora --reps 1 --layers 30 --steps 3 --warmup 1 --tag "30 layers"

# The real recipe: dtr-train on 4 ranks, the recipe as written except: 5 steps, no checkpoint or
# validation, outputs in a scratch directory, MFU against the SGEMM peak split over the ranks.
RECIPE_DIR="${RAW%.jsonl}.recipe"
recipe() {
  local peak_tf mpi=(mpirun -np 4 --oversubscribe -x OMP_NUM_THREADS=1)
  [ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
  peak_tf=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_gflops"] / 4 / 1000)' "$PEAK")
  [ -e "$ROOT/data/smollm2-135m-instruct.gguf" ] || { echo "recipe: data/smollm2-135m-instruct.gguf missing (scripts/fetch-model.sh)"; return 1; }
  (cd "$ROOT" && "${mpi[@]}" "$BUILD_DIR/bin/dtr-train" --config configs/smollm2_lora_perlfaq.yaml --progress lines \
     --set step_scheduler.max_steps=5 --set checkpoint.enabled=false --set step_scheduler.val_every_steps=1000 \
     --set step_scheduler.ckpt_every_steps=1000 --set checkpoint.checkpoint_dir="$RECIPE_DIR" \
     --set logging.peak_tflops="$peak_tf" --overwrite) >"$RECIPE_DIR.log" 2>&1 || { tail -5 "$RECIPE_DIR.log"; return 1; }
  tail -3 "$RECIPE_DIR.log"
}
has recipe && section recipe recipe

# The other bench/compare scripts, when present, each under a hard time limit, and skipped when
# its limit would take the run past BUDGET_S (22 minutes): name:limit-seconds:command. families.sh
# (issue 18) appends its Gemma 3 / Qwen3 rows to this run's table; head.sh (the 262k-vocabulary
# head) and moe.sh (one MoE layer) print their own tables (kept in <raw>.<name>.log).
BUDGET_S=${BUDGET_S:-1320}
if has others; then
  for spec in "families:250:bash $HERE/families.sh --no-build --raw $RAW --peak-json $PEAK --no-report" \
              "head:170:bash $HERE/head.sh --shapes gemma3:1024,smollm2:1024" \
              "moe:120:bash $HERE/moe.sh --reps 2"; do
    IFS=: read -r name limit cmd <<<"$spec"
    script=${cmd#bash }; script=${script%% *}
    [ -f "$script" ] || { echo "== $name: $script not present, skipped"; continue; }
    if [ "$DRY" = 0 ] && (( $(date +%s) - T0 + limit > BUDGET_S )); then
      echo "== $name: skipped, its ${limit}s limit would pass the ${BUDGET_S}s budget (+$(( $(date +%s) - T0 ))s so far)"
      SUMMARY+=("$name skipped (budget)")
      continue
    fi
    # shellcheck disable=SC2086
    section "$name" logged "${RAW%.jsonl}.$name.log" timeout "$limit" $cmd
    [ "$DRY" = 1 ] || tail -20 "${RAW%.jsonl}.$name.log"
  done
fi

[ "$DRY" = 1 ] && exit 0
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" "$HERE/report.py" --raw "$RAW" --peak "$(cat "$PEAK")" --out "$OUT_DIR/quiet-$(date -u +%Y-%m-%d)" \
  --gemm "${RAW%.jsonl}.gemm.txt" --recipe "$RECIPE_DIR/metrics.jsonl" \
  --recipe-desc "configs/smollm2_lora_perlfaq.yaml, 30 layers, 4 ranks x 1 thread FSDP2, seq 256, global batch 8" \
  --command "bash bench/compare/quiet_window.sh --only $ONLY"
echo "sections: ${SUMMARY[*]}; total $(( $(date +%s) - T0 ))s"
