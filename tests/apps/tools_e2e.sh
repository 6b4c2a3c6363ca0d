#!/usr/bin/env bash
# dtr-train's PEFT export, dtr-convert merge-adapter and dtr-generate work together, on the tiny
# HF model of tests/golden/automodel_tiny (run from the repo root):
#   tools_e2e.sh DTR_TRAIN DTR_CONVERT DTR_GENERATE
# - the adapter's base_model_name_or_path is a directory PEFT can load (absolute HF dir), and
#   dtr_adapter.json keeps the model path dtr trained on; with /work/.venv-ref (or $DTR_BENCH_VENV)
#   present, peft's AutoPeftModelForCausalLM.from_pretrained(adapter) loads it;
# - merge-adapter writes the tokenizer files next to the merged weights;
# - gguf-to-hf of a GGUF without a tokenizer writes the model and says the tokenizer is missing;
# - dtr-generate takes its tokenizer from an HF directory and prints its defaults in --help.
set -uo pipefail
TRAIN="$1"; CONVERT="$2"; GENERATE="$3"
fail() { echo "FAIL: $*"; exit 1; }
d=out/tools_e2e
rm -rf $d && mkdir -p $d
"$TRAIN" --config tests/automodel/llama3_2_1b_squad_peft.yaml --set step_scheduler.max_steps=1 \
    --set step_scheduler.global_batch_size=4 --set step_scheduler.local_batch_size=2 \
    --set checkpoint.checkpoint_dir=$d/run > $d.train.log 2>&1 || { tail -5 $d.train.log; fail "dtr-train"; }
cfg=$d/run/adapter/adapter_config.json
base=$(sed -n 's/.*"base_model_name_or_path": *"\([^"]*\)".*/\1/p' $cfg)
[ -n "$base" ] && [ -f "$base/config.json" ] || fail "adapter base_model_name_or_path '$base' is not a model directory"
grep -q '"base_model_path"' $d/run/adapter/dtr_adapter.json || fail "dtr_adapter.json lacks base_model_path"
echo "ok adapter base_model_name_or_path = $base"
venv="${DTR_BENCH_VENV:-/work/.venv-ref}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import peft" 2>/dev/null; then
  "$venv/bin/python" - "$d/run/adapter" <<'PY' || fail "peft could not load the adapter"
import sys
from peft import AutoPeftModelForCausalLM
m = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1])
print("ok peft AutoPeftModelForCausalLM.from_pretrained:", type(m).__name__)
PY
else
  echo "SKIP peft load: no venv with peft at $venv"
fi
"$CONVERT" merge-adapter tests/golden/automodel_tiny $d/run/adapter $d/merged > /dev/null || fail "merge-adapter"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [ -f $d/merged/$f ] || fail "merge-adapter output lacks $f"
done
echo "ok merge-adapter wrote the tokenizer files"
# gguf-to-hf of a GGUF without a tokenizer: the model alone, and the closing line says so.
line=$("$CONVERT" gguf-to-hf tests/golden/qwen3_moe_gguf/qwen3_moe_debug.gguf $d/notok) || fail "gguf-to-hf without a tokenizer"
grep -qF "no tokenizer files: the GGUF holds no tokenizer (no tokenizer.ggml.tokens)" <<<"$line" ||
  fail "gguf-to-hf without a tokenizer printed: $line"
[ -f $d/notok/model.safetensors ] && [ ! -f $d/notok/tokenizer.json ] || fail "gguf-to-hf without a tokenizer: wrong files"
echo "ok gguf-to-hf without a tokenizer: $line"
out=$("$GENERATE" --model $d/merged --prompt "Who created Perl?" --max-new-tokens 3 2>&1) ||
  { echo "$out"; fail "dtr-generate with the tokenizer of an HF directory"; }
echo "ok dtr-generate --model <HF dir> (tokenizer from tokenizer.json): '$out'"
help=$("$GENERATE" --help)
grep -q -- "--max-new-tokens.*64" <<<"$help" && grep -q -- "--top-p.*0.9" <<<"$help" ||
  { echo "$help"; fail "dtr-generate --help does not print the defaults"; }
echo "ok dtr-generate --help prints the defaults"
echo PASS
