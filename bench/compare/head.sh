#!/usr/bin/env bash
# dtr vs PyTorch on the language-model head + loss (forward + backward, f32), side by side in one
# run: `dtr-bench head` (fused linear_cross_entropy, and dtr's unfused linear + cross_entropy)
# and PyTorch's F.linear + F.cross_entropy (bench/compare/torch_head.py), one process per
# measurement (peak memory), on the Gemma 3 shape (hidden 640, vocab 262144) and the SmolLM2 shape
# (576, 49152). Prints step time, peak memory above the inputs (RSS; the allocator's peak for
# dtr too) and the dtr / PyTorch ratios (time: torch / dtr, > 1 = dtr faster; memory: dtr / torch).
#
#   bash bench/compare/head.sh [--threads T] [--steps 2] [--warmup 1]
#       [--shapes gemma3:1024,smollm2:1024,smollm2:4096] [--no-unfused]
#
# Shapes: gemma3 (640 x 262144) or smollm2 (576 x 49152), ':' tokens. Environment: DTR_BENCH_VENV
# (a Python with torch; default /work/.venv-ref if it exists, else /tmp/dtr-bench-venv),
# DTR_BUILD_DIR (default build/). About 3 minutes on a quiet 2-core machine with the defaults.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
die() { echo "head.sh: error: $*" >&2; exit 1; }
THREADS=$(nproc) STEPS=2 WARMUP=1 SHAPES=gemma3:1024,smollm2:1024,smollm2:4096 UNFUSED=1
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --shapes) SHAPES=$2; shift 2 ;;
    --no-unfused) UNFUSED=0; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
source "$ROOT/bench/compare/bench_env.sh"  # PY, BENCH
[ -x "$BENCH" ] || die "$BENCH not found (ninja -C build dtr-bench)"
"$PY" -c "import torch" 2>/dev/null || die "$PY cannot import torch (set DTR_BENCH_VENV)"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
START=$(date +%s)
for s in ${SHAPES//,/ }; do
  name=${s%%:*} tokens=${s##*:}
  case "$name" in
    gemma3) H=640 V=262144 ;;
    smollm2) H=576 V=49152 ;;
    *) die "unknown shape '$name' in --shapes (expected gemma3:TOKENS or smollm2:TOKENS)" ;;
  esac
  args=(--tokens "$tokens" --hidden "$H" --vocab "$V" --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS")
  impls=(fused)
  [ "$UNFUSED" = 1 ] && impls+=(unfused)
  for impl in "${impls[@]}"; do
    OMP_NUM_THREADS=$THREADS "$BENCH" head --impl "$impl" "${args[@]}" | tail -1 | sed "s/^{/{\"shape\": \"$name\", /" >> "$OUT"
  done
  OMP_NUM_THREADS=$THREADS "$PY" "$ROOT/bench/compare/torch_head.py" "${args[@]}" | tail -1 |
    sed "s/^{/{\"shape\": \"$name\", /" >> "$OUT"
done
"$PY" - "$OUT" "$(( $(date +%s) - START ))" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
print(f"LM head + loss, forward + backward, f32, {rows[0]['threads'] if rows else '?'} threads "
      f"({sys.argv[2]} s, load {sys.argv[3]})")
print(f"{'shape':<8} {'tokens':>6} {'impl':<12} {'ms/step':>9} {'GFLOP/s':>8} {'peak RSS +MiB':>14} "
      f"{'alloc +MiB':>11} {'loss':>9} {'time torch/x':>12} {'mem x/torch':>11}")
keys = sorted({(r["shape"], r["tokens"]) for r in rows}, key=lambda k: (k[0] != "gemma3", k))
for k in keys:
    rs = [r for r in rows if (r["shape"], r["tokens"]) == k]
    torch_r = next((r for r in rs if r["impl"] == "torch"), None)
    for r in rs:
        tr = torch_r["step_ms_median"] / r["step_ms_median"] if torch_r else float("nan")
        mr = r["peak_rss_delta_mib"] / torch_r["peak_rss_delta_mib"] if torch_r else float("nan")
        alloc = f"{r['peak_alloc_mib']:11.0f}" if "peak_alloc_mib" in r else f"{'-':>11}"
        print(f"{k[0]:<8} {k[1]:>6} {r['impl']:<12} {r['step_ms_median']:9.1f} "
              f"{r['head_gflop_per_step'] / r['step_ms_median'] * 1e3:8.1f} {r['peak_rss_delta_mib']:14.0f} {alloc} "
              f"{r['loss']:9.5f} {tr:12.2f} {mr:11.2f}")
PYEOF
