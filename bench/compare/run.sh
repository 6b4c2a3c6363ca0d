#!/usr/bin/env bash
# dtr vs PyTorch, side by side: the same Llama training step (bench/compare/README.md).
#
#   bash bench/compare/run.sh [--reps R] [--layers N] [--seq S] [--batch B] [--steps K]
#        [--warmup W] [--threads T] [--scenarios lora,full,dp,dp4,gemma3,qwen3] [--no-build]
#        [--tag TAG] [--raw FILE] [--peak-json FILE] [--no-report]
#
# Each flag has an environment twin (REPS, LAYERS, SEQ, BATCH, STEPS, WARMUP, THREADS,
# SCENARIOS). Other environment: DTR_BENCH_VENV (PyTorch venv, default /tmp/dtr-bench-venv;
# created with the pin of requirements.txt when it has no torch), DTR_BUILD_DIR (default
# build/; dtr-bench is built there when missing), OUT_DIR (default out/bench).
#
# Scenarios: lora = LoRA r 8 on q,k,v,o,gate,up,down; full = full fine-tune; dp = 2 ranks x 1
# thread, LoRA, dtr FSDP (mpirun) vs PyTorch FSDP2 fully_shard (torchrun, gloo); dp4 = the same
# on 4 ranks x 1 thread (oversubscribed when the machine has fewer than 4 cores); gemma3, qwen3 =
# LoRA on Gemma 3 270M / Qwen3-0.6B vs transformers' own classes (families.sh sets their shape:
# GEMMA3_MODEL GEMMA3_LAYERS QWEN3_MODEL QWEN3_LAYERS; FAMILY_PY = a Python with transformers and
# peft, default /work/.venv-ref when it exists, else the venv's). Both
# implementations run alternately, REPS times each, on the same config and thread count.
# The SGEMM peak (MFU denominator) is measured in the same run: max of torch.mm f32 2048^3 and
# dtr-bench gemm's best 1024^3 figure (dtr's own kernel or raw Eigen), at THREADS threads.
# Several runs into one table (bench/compare/quiet_window.sh): --raw FILE appends to FILE,
# --tag TAG labels the rows (e.g. seq2048, 30 layers), --peak-json FILE reuses the peak of an
# earlier run (written by each run next to its raw file as <raw>.peak.json), --no-report
# leaves the table to a later report.py call.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/bench/compare"
die() { echo "run.sh: error: $*" >&2; exit 1; }

REPS=${REPS:-3} LAYERS=${LAYERS:-8} SEQ=${SEQ:-256} BATCH=${BATCH:-4} STEPS=${STEPS:-5} WARMUP=${WARMUP:-1}
THREADS=${THREADS:-$(nproc)} SCENARIOS=${SCENARIOS:-lora,full,dp} BUILD=1 TAG="" RAW="" PEAK_FILE="" REPORT=1
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --tag) TAG=$2; shift 2 ;;
    --raw) RAW=$2; shift 2 ;;
    --peak-json) PEAK_FILE=$2; shift 2 ;;
    --no-report) REPORT=0; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
VENV=${DTR_BENCH_VENV:-/tmp/dtr-bench-venv}
BUILD_DIR=${DTR_BUILD_DIR:-$ROOT/build}
OUT_DIR=${OUT_DIR:-$ROOT/out/bench}
case "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/" in
  "$ROOT"/*) git -C "$ROOT" check-ignore -q "$VENV" || die "venv $VENV is inside the repository and not git-ignored" ;;
esac

# ---- PyTorch venv ---------------------------------------------------------------------------
PY="$VENV/bin/python"
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  LOG="${TMPDIR:-/tmp}/dtr-bench-venv-install.log"
  echo "creating PyTorch venv $VENV (log: $LOG)"
  python3 -m venv "$VENV" >"$LOG" 2>&1 || die "cannot create the venv $VENV (python3 -m venv failed; see $LOG)"
  # The CPU wheel index first; PyPI's default wheel (same CPU kernels, CUDA libraries unused)
  # where that index cannot be reached.
  if ! "$VENV/bin/pip" install -r "$HERE/requirements.txt" --index-url https://download.pytorch.org/whl/cpu >>"$LOG" 2>&1 &&
     ! "$VENV/bin/pip" install -r "$HERE/requirements.txt" >>"$LOG" 2>&1; then
    die "cannot install torch into $VENV (no network or no registry? see $LOG)"
  fi
  "$PY" -c 'import torch' >/dev/null 2>&1 || die "torch installed in $VENV but does not import (see $LOG)"
fi
TORCHRUN="$VENV/bin/torchrun"

# ---- dtr-bench -------------------------------------------------------------------------------
DTR_BENCH="$BUILD_DIR/bin/dtr-bench"
if [ ! -x "$DTR_BENCH" ] && [ "$BUILD" = 1 ]; then
  echo "building dtr-bench in $BUILD_DIR (configure as scripts/build.sh, target dtr-bench only)"
  { cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTR_CUDA=OFF &&
    ninja -C "$BUILD_DIR" -j"$(nproc)" dtr-bench; } >"$OUT_DIR.build.log" 2>&1 ||
    { mkdir -p "$(dirname "$OUT_DIR")"; die "building dtr-bench failed (see $OUT_DIR.build.log; scripts/install-deps.sh installs the dependencies)"; }
fi
[ -x "$DTR_BENCH" ] || die "dtr-bench not found at $DTR_BENCH (build it: scripts/build.sh, or set DTR_BUILD_DIR)"
USAGE=$("$DTR_BENCH" --help 2>&1 || true)  # the help lists the subcommands
for c in train-step cpu-peak; do grep -qw -- "$c" <<<"$USAGE" || die "$DTR_BENCH has no $c command (rebuild it from a newer tree)"; done

# ---- run ---------------------------------------------------------------------------------------
mkdir -p "$OUT_DIR"
STAMP=$(date -u +%Y%m%d-%H%M%S)
if [ -z "$RAW" ]; then RAW="$OUT_DIR/compare-$STAMP.jsonl"; : >"$RAW"; fi
LOGDIR="${RAW%.jsonl}.logs/$STAMP${TAG:+-$TAG}"
mkdir -p "$LOGDIR"
export OMP_NUM_THREADS=$THREADS
MPIRUN=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
SHAPE=(--layers "$LAYERS" --seq "$SEQ" --batch "$BATCH" --lora-rank 8 --lora-alpha 16 --steps "$STEPS" --warmup "$WARMUP")
echo "dtr vs PyTorch: layers $LAYERS seq $SEQ batch $BATCH steps $STEPS (+$WARMUP warm-up), threads $THREADS," \
     "reps $REPS, scenarios $SCENARIOS; logs $LOGDIR"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# record <scenario> <impl> <note> <log>: appends the log's last JSON line, tagged with the
# scenario, tag and shape (report.py computes each row's FLOPs from its own shape), to $RAW.
record() {
  local line
  line=$(grep '^{' "$4" | tail -1) || die "$2 $1 printed no JSON (see $4)"
  "$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(scenario=sys.argv[2], impl=sys.argv[3], note=sys.argv[4], load=sys.argv[5], tag=sys.argv[6], shape=json.loads(sys.argv[7])); print(json.dumps(d))' \
    "$line" "$1" "$2" "$3" "$(cut -d' ' -f1 /proc/loadavg)" "$TAG" \
    "{\"layers\": $(layers_of "$1"), \"seq\": $SEQ, \"batch\": $BATCH, \"steps\": $STEPS, \"warmup\": $WARMUP, \"threads\": $THREADS, \"world\": $(ranks "$1")}" >>"$RAW"
}
ranks() { case "$1" in dp) echo 2 ;; dp4) echo 4 ;; *) echo 1 ;; esac; }
layers_of() { case "$1" in gemma3) echo "$GEMMA3_LAYERS" ;; qwen3) echo "$QWEN3_LAYERS" ;; *) echo "$LAYERS" ;; esac; }

# Families (gemma3, qwen3): dtr-bench --model; its resolved config.json is what transformers builds
# (written by the dtr run, which goes first in rep 1).
FPY=${FAMILY_PY:-$([ -x /work/.venv-ref/bin/python ] && echo /work/.venv-ref/bin/python || echo "$PY")}
GEMMA3_MODEL=${GEMMA3_MODEL:-$([ -f "$ROOT/data/gemma3-270m-q4_k_m.gguf" ] && echo "$ROOT/data/gemma3-270m-q4_k_m.gguf" ||
  echo "$HERE/configs/gemma3_270m.json")} GEMMA3_LAYERS=${GEMMA3_LAYERS:-18}
QWEN3_MODEL=${QWEN3_MODEL:-$HERE/configs/qwen3_0.6b.json} QWEN3_LAYERS=${QWEN3_LAYERS:-28}
family_args() {  # family_args <gemma3|qwen3>: dtr-bench's --model, --layers and --save-config
  case "$1" in
    gemma3) echo --model "$GEMMA3_MODEL" --layers "$GEMMA3_LAYERS" --save-config "$LOGDIR/gemma3.config.json" ;;
    qwen3) echo --model "$QWEN3_MODEL" --layers "$QWEN3_LAYERS" --save-config "$LOGDIR/qwen3.config.json" ;;
  esac
}
FAMILY_SHAPE=(--seq "$SEQ" --batch "$BATCH" --lora-rank 8 --lora-alpha 16 --steps "$STEPS" --warmup "$WARMUP")
case ",$SCENARIOS," in *,gemma3,*|*,qwen3,*)
  "$FPY" -c 'import torch, transformers, peft' 2>/dev/null ||
    die "$FPY cannot import torch, transformers and peft (the gemma3 / qwen3 scenarios; set FAMILY_PY)" ;;
esac

if [ -n "$PEAK_FILE" ]; then
  PEAK_JSON=$(cat "$PEAK_FILE") || die "cannot read the peak JSON $PEAK_FILE"
else
# SGEMM peak, same run: torch.mm 2048^3 f32 (best of 5) and dtr-bench gemm's best 1024^3 figure
# (dtr's own kernel or raw Eigen).
"$PY" - "$THREADS" >"$LOGDIR/peak_torch.log" 2>&1 <<'EOF' || die "torch SGEMM peak failed (see $LOGDIR/peak_torch.log)"
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
n = 2048
a, b = torch.randn(n, n), torch.randn(n, n)
torch.mm(a, b)
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    torch.mm(a, b)
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"torch_mm_2048_gflops": 2 * n**3 / best * 1e-9}))
EOF
"$DTR_BENCH" gemm >"$LOGDIR/peak_dtr_gemm.log" 2>&1 || die "dtr-bench gemm failed (see $LOGDIR/peak_dtr_gemm.log)"
cp "$LOGDIR/peak_dtr_gemm.log" "${RAW%.jsonl}.gemm.txt"
# The machine's theoretical FMA peak (the second MFU denominator; derivation printed).
"$DTR_BENCH" cpu-peak --threads "$THREADS" >"$LOGDIR/cpu_peak.log" 2>&1 || die "dtr-bench cpu-peak failed (see $LOGDIR/cpu_peak.log)"
PEAK_JSON=$("$PY" - "$LOGDIR/peak_torch.log" "$LOGDIR/peak_dtr_gemm.log" "$LOGDIR/cpu_peak.log" <<'EOF'
import json, re, sys
t = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["torch_mm_2048_gflops"]
theo = json.loads([l for l in open(sys.argv[3]) if l.startswith("{")][-1])
best = 0.0
cols = []
for l in open(sys.argv[2]):  # header "shape  dtr GF/s  sgemm  Eigen ..." and row "square 1024 ..." (the
    f = l.split()            # small attention bmm row is too short to time reliably on a loaded machine)
    if l.startswith("shape"):
        cols = [c for c in f[1:] if c != "GF/s"]
    if l.startswith("square 1024") and cols:
        vals = {}
        for c, v in zip(cols, f[2:]):  # first column of each name (GF/s); the best GEMM dtr measured
            vals.setdefault(c, v)
        best = max(float(vals[c]) for c in ("dtr", "sgemm", "Eigen") if c in vals and re.match(r"^[0-9.]+$", vals[c]))
src = "torch.mm 2048^3" if t >= best else "dtr-bench gemm 1024^3 (best of dtr's kernel and raw Eigen)"
print(json.dumps({"torch_mm_gflops": t, "dtr_gemm_best_gflops": best, "peak_gflops": max(t, best), "peak_source": src,
                  "theoretical": theo}))
EOF
)
fi
echo "$PEAK_JSON" >"${RAW%.jsonl}.peak.json"
echo "SGEMM peak ($THREADS threads): $PEAK_JSON"

run_dtr() {  # run_dtr <scenario> <log>
  case "$1" in
    lora) "$DTR_BENCH" train-step "${SHAPE[@]}" --threads "$THREADS" >"$2" 2>&1 ;;
    full) "$DTR_BENCH" train-step "${SHAPE[@]}" --threads "$THREADS" --full-ft >"$2" 2>&1 ;;
    dp|dp4) "${MPIRUN[@]}" -np "$(ranks "$1")" "$DTR_BENCH" train-step "${SHAPE[@]}" --threads 1 --fsdp >"$2" 2>&1 ;;
    gemma3|qwen3) "$DTR_BENCH" train-step $(family_args "$1") "${FAMILY_SHAPE[@]}" --threads "$THREADS" >"$2" 2>&1 ;;
  esac
}
TORCH_DP=--fsdp
run_torch() {  # run_torch <scenario> <log>
  case "$1" in
    lora) "$PY" "$HERE/torch_llama_lora.py" "${SHAPE[@]}" --threads "$THREADS" >"$2" 2>&1 ;;
    full) "$PY" "$HERE/torch_llama_lora.py" "${SHAPE[@]}" --threads "$THREADS" --full-ft >"$2" 2>&1 ;;
    dp|dp4) OMP_NUM_THREADS=1 "$TORCHRUN" --nproc-per-node "$(ranks "$1")" "$HERE/torch_llama_lora.py" "${SHAPE[@]}" --threads 1 \
          $TORCH_DP >"$2" 2>&1 ;;
    gemma3|qwen3) "$FPY" "$HERE/torch_family_lora.py" --config "$LOGDIR/$1.config.json" "${FAMILY_SHAPE[@]}" \
          --threads "$THREADS" >"$2" 2>&1 ;;
  esac
}

IFS=, read -r -a SCEN <<<"$SCENARIOS"
for s in "${SCEN[@]}"; do
  case "$s" in lora|full|dp|dp4|gemma3|qwen3) ;; *) die "unknown scenario '$s' (lora, full, dp, dp4, gemma3, qwen3)" ;; esac
  for ((r = 1; r <= REPS; r++)); do
    order=(dtr torch); ((r % 2 == 0)) && order=(torch dtr)  # alternate who goes first
    for impl in "${order[@]}"; do
      log="$LOGDIR/$s-$impl-$r.log"
      echo "  [$(date -u +%H:%M:%S)] $s${TAG:+ ($TAG)} $impl rep $r (load $(cut -d' ' -f1 /proc/loadavg))"
      if [ "$impl" = dtr ]; then
        run_dtr "$s" "$log" || die "dtr $s failed (see $log)"
        record "$s" dtr "" "$log"
      else
        if ! run_torch "$s" "$log"; then
          if [[ "$s" = dp* ]] && [ "$TORCH_DP" = --fsdp ]; then
            echo "  PyTorch FSDP2 failed on gloo (see $log); falling back to DDP"
            TORCH_DP=--ddp
            run_torch "$s" "$log" || die "PyTorch $s (DDP) failed (see $log)"
          else
            die "PyTorch $s failed (see $log)"
          fi
        fi
        record "$s" pytorch "$([[ "$s" = dp* ]] && echo "${TORCH_DP#--}")" "$log"
      fi
    done
  done
done

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$REPORT" = 1 ] || exit 0
"$PY" "$HERE/report.py" --raw "$RAW" --peak "$PEAK_JSON" --out "$OUT_DIR/compare-$(date -u +%Y-%m-%d)" \
  --command "bash bench/compare/run.sh --reps $REPS --layers $LAYERS --seq $SEQ --batch $BATCH --steps $STEPS --warmup $WARMUP --threads $THREADS --scenarios $SCENARIOS"
