#!/usr/bin/env bash
# gpu-check: the GPU acceptance run of dtr, for one machine with an NVIDIA GPU (sized for one
# H200: under 8 minutes). Steps:
#   1. checks that a GPU is visible (nvidia-smi), else fails at once;
#   2. builds the CUDA backend (Release, sm_90: -DCMAKE_CUDA_ARCHITECTURES=90) in build-gpu-check/:
#      the CUDA tests first (their results come even if the rest is slow), then dtr-bench and
#      dtr-train;
#   3. runs the CUDA-labelled tests (`ctest -L cuda`: every CUDA kernel against the CPU backend,
#      forward and backward; allocator; copies; GEMM; collectives on CUDA tensors; fully_shard,
#      replicate, TP styles and loss parallel on a CUDA mesh vs the CPU, 1 rank (NCCL) and 2 ranks
#      (MPI staging)) with DTR_TEST_REQUIRE_CUDA=1, so that a test that would skip for lack of a
#      GPU fails; after building dtr-train, train_cuda_train (3 dtr-train steps of the debug model
#      with model.device: cuda equal the CPU run);
#   4. runs the 1-GPU LoRA training step benchmark (dtr-bench train-step --device cuda, SmolLM2-135M
#      shape, LoRA r 8) when dtr-bench train-step accepts --device (else says that it is skipped);
#   5. runs `dtr-bench gemm-gpu` (cuBLASLt TFLOP/s for transformer shapes vs raw cuBLAS peak);
#   6. writes a summary to $OUT/gpu-summary.txt when $OUT is set, else out/gpu-summary.txt.
# Exit status: 0 when every step passed, 1 otherwise (the summary says which step failed).
# Environment: JOBS (build parallelism, default nproc), BUILD_DIR (default build-gpu-check).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-gpu-check}
JOBS=${JOBS:-$(nproc)}
if [ -n "${OUT:-}" ]; then SUMMARY_DIR=$OUT; else SUMMARY_DIR=$ROOT/out; fi
mkdir -p "$SUMMARY_DIR"
SUMMARY=$SUMMARY_DIR/gpu-summary.txt
LOGDIR=$SUMMARY_DIR/gpu-check-logs
mkdir -p "$LOGDIR"
: >"$SUMMARY"
START=$(date +%s)
STATUS=0

say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START ))s; }
fail() {
  say "FAIL: $*"
  STATUS=1
}

say "dtr gpu-check  $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# ---- 1. a GPU must be visible ------------------------------------------------------------------
# (the CUDA tests then fail if they still skip for lack of a device: see step 3)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$LOGDIR/nvidia-smi.txt" 2>&1 &&
   grep -q "^GPU " "$LOGDIR/nvidia-smi.txt"; then
  say "GPU: $(head -1 "$LOGDIR/nvidia-smi.txt")"
  nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/driver, memory: /' | tee -a "$SUMMARY"
elif ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  say "GPU: nvidia-smi unavailable, device nodes present: $(ls /dev/nvidia[0-9]* | tr '\n' ' ')"
else
  say "FAIL: no NVIDIA GPU visible (no nvidia-smi GPU, no /dev/nvidia0): gpu-check needs a GPU machine"
  exit 1
fi
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
say "nvcc: $("$NVCC" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"

# ---- 2. build --------------------------------------------------------------------------------
say ""
say "== build (Release, CUDA sm_90, -j$JOBS) =="
T0=$(date +%s)
if timeout 330 cmake -S . -B "$BUILD_DIR" -G Ninja -DDTR_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$NVCC" >"$LOGDIR/cmake.log" 2>&1 &&
   timeout 330 ninja -C "$BUILD_DIR" -j"$JOBS" tests/cuda/all >"$LOGDIR/build.log" 2>&1; then
  say "build: ok in $(( $(date +%s) - T0 ))s"
else
  tail -30 "$LOGDIR/build.log" "$LOGDIR/cmake.log" 2>/dev/null
  fail "build (see $LOGDIR/build.log)"
  say "total $(elapsed)"
  exit 1
fi

# ---- 3. CUDA tests -----------------------------------------------------------------------------
say ""
say "== ctest -L cuda =="
T0=$(date +%s)
# DTR_TEST_REQUIRE_CUDA=1: a test that would skip for lack of a device fails instead.
# train_cuda_train needs dtr-train, built with dtr-bench in step 4, and runs there.
(cd "$BUILD_DIR" && DTR_TEST_REQUIRE_CUDA=1 timeout 200 ctest -L cuda -E '^train_cuda' --output-on-failure --timeout 150) \
  >"$LOGDIR/ctest-console.log" 2>&1
CTEST_RC=$?
grep -E "tests passed|tests failed|^\s+[0-9]+ - " "$LOGDIR/ctest-console.log" | tee -a "$SUMMARY"
if [ $CTEST_RC -ne 0 ]; then
  fail "ctest -L cuda (rc $CTEST_RC; see $LOGDIR/ctest-console.log)"
fi
say "tests: $(( $(date +%s) - T0 ))s"

# ---- 4. 1-GPU LoRA training step ---------------------------------------------------------------
say ""
say "== build dtr-bench, dtr-train =="
T0=$(date +%s)
if timeout 300 ninja -C "$BUILD_DIR" -j"$JOBS" dtr-bench dtr-train compare_metrics >"$LOGDIR/build-bench.log" 2>&1; then
  say "build: ok in $(( $(date +%s) - T0 ))s"
else
  tail -30 "$LOGDIR/build-bench.log"
  fail "build of dtr-bench (see $LOGDIR/build-bench.log)"
  say "gpu-check: FAILED in $(elapsed)"
  exit 1
fi
say ""
say "== dtr-train, 3 steps of the debug model with model.device: cuda vs cpu (ctest train_cuda_train) =="
(cd "$BUILD_DIR" && DTR_TEST_REQUIRE_CUDA=1 timeout 150 ctest -R '^train_cuda_train$' --output-on-failure --timeout 120) \
  >"$LOGDIR/ctest-train-cuda.log" 2>&1 || fail "train_cuda_train (see $LOGDIR/ctest-train-cuda.log)"
grep -E "tests passed|tests failed|cuda vs cpu|FAIL" "$LOGDIR/ctest-train-cuda.log" | tee -a "$SUMMARY"
say ""
say "== LoRA training step on the GPU =="
if grep -q -- '"--device"' bench/train_step.cpp 2>/dev/null; then
  if timeout 120 "$BUILD_DIR/bin/dtr-bench" train-step --device cuda --steps 5 --warmup 1 \
       >"$LOGDIR/train-step.log" 2>&1; then
    tail -1 "$LOGDIR/train-step.log" | tee -a "$SUMMARY"
  else
    tail -20 "$LOGDIR/train-step.log"
    fail "dtr-bench train-step --device cuda (see $LOGDIR/train-step.log)"
  fi
else
  say "skipped: neither dtr-train nor dtr-bench train-step has a device option yet (no CUDA training path)"
fi

# ---- 5. GEMM benchmark --------------------------------------------------------------------------
say ""
say "== dtr-bench gemm-gpu (bf16) =="
if timeout 120 "$BUILD_DIR/bin/dtr-bench" gemm-gpu --dtype bf16 >"$LOGDIR/gemm-gpu.log" 2>&1; then
  cat "$LOGDIR/gemm-gpu.log" | tee -a "$SUMMARY"
else
  tail -20 "$LOGDIR/gemm-gpu.log" | tee -a "$SUMMARY"
  fail "dtr-bench gemm-gpu (see $LOGDIR/gemm-gpu.log)"
fi

say ""
if [ $STATUS -eq 0 ]; then say "gpu-check: PASS in $(elapsed)"; else say "gpu-check: FAILED in $(elapsed)"; fi
say "summary: $SUMMARY"
exit $STATUS
