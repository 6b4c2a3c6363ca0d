#!/usr/bin/env bash
# dtr-generate end to end on the real model: greedy decoding of a fixed question must mention
# "Larry Wall" (SmolLM2-135M-Instruct's greedy answer to "What is Perl?", checked by hand).
# Skips (exit 0 with a message) when data/smollm2-135m-instruct.gguf is absent.
set -euo pipefail
bin="$1"
model=data/smollm2-135m-instruct.gguf
if [ ! -f "$model" ]; then echo "SKIP: $model is absent (run scripts/fetch-model.sh)"; exit 0; fi
out=$("$bin" --model "$model" --prompt "What is Perl?" --max-new-tokens 16)
echo "$out"
grep -q "Larry Wall" <<<"$out"
# Bad input: a missing adapter directory is one error line and a non-zero exit.
if "$bin" --model "$model" --adapter /nonexistent --prompt x >/dev/null 2>&1; then exit 1; fi
