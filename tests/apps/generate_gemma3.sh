#!/usr/bin/env bash
# dtr-generate on the real Gemma 3 270M GGUF: the SentencePiece tokenizer chosen from the GGUF's
# tokenizer.ggml.model, Gemma's chat template chosen for the family (the GGUF carries none; also
# given as --chat-template gemma), greedy decoding token for token equal to transformers'
# (tests/golden/gemma3_270m_generate.json from make_gemma3_generate_fixture.py).
# Skips (exit 0 with a message) when data/gemma3-270m-q4_k_m.gguf is absent.
set -euo pipefail
bin="$1"
model=data/gemma3-270m-q4_k_m.gguf
fix=tests/golden/gemma3_270m_generate.json
if [ ! -f "$model" ]; then echo "SKIP: $model is absent (run scripts/fetch-model.sh gemma3)"; exit 0; fi
n=$(jq '.cases | length' "$fix")
max=$(jq '.max_new_tokens' "$fix")
for i in $(seq 0 $((n - 1))); do
  prompt=$(jq -r ".cases[$i].prompt" "$fix")
  want=$(jq -r ".cases[$i].output_ids | map(tostring) | join(\" \")" "$fix")
  extra=(); [ "$i" -eq 1 ] && extra=(--chat-template gemma)  # by name once, recognised by family otherwise
  got=$("$bin" --model "$model" --prompt "$prompt" --max-new-tokens "$max" --print-ids "${extra[@]}")
  echo "prompt: $prompt"
  echo "  dtr:          $got"
  echo "  transformers: $want"
  [ "$got" = "$want" ] || { echo "FAIL: greedy ids differ"; exit 1; }
  if [ "$i" -eq 0 ]; then  # the decoded text once (each run takes a minute on a loaded 2-core machine)
    text=$("$bin" --model "$model" --prompt "$prompt" --max-new-tokens "$max" "${extra[@]}")
    [ "$text" = "$(jq -r ".cases[$i].text" "$fix")" ] || { echo "FAIL: decoded text differs: '$text'"; exit 1; }
  fi
done
echo "ok: $n prompts, greedy ids (and the first one's text) equal transformers'"
