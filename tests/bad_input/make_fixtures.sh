#!/usr/bin/env bash
# Builds the bad files of the bad-input corpus into FIX (run from the repo root):
#   make_fixtures.sh FIX DTR_TRAIN
set -euo pipefail
FIX="$1"; TRAIN="$2"
rm -rf "$FIX" && mkdir -p "$FIX"
cd "$FIX"
# recipes
: > empty.yaml
echo "just a string" > scalar.yaml
printf -- '- model\n- dataset\n' > list.yaml
printf 'model:\n  config: debug\n  dtype: [f32\n' > syntax.yaml
printf 'model:\n  dtype: f32\ndataset:\n  path: x.txt\n' > nomodel.yaml
# model files
printf 'NOPE this is not a gguf file at all, just some bytes................' > bad.gguf
printf 'GGUF\x03\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00' > trunc.gguf
mkdir -p hf_badjson hf_nokey hf_type hf_noweights
echo '{"hidden_size": 64, "vocab_size": ' > hf_badjson/config.json
echo '{"model_type": "llama", "vocab_size": 256}' > hf_nokey/config.json
sed 's/"hidden_size": *[0-9]*/"hidden_size": "wide"/' "$OLDPWD/tests/golden/llama_debug/config.json" > hf_type/config.json
sed 's/"vocab_size": *[0-9]*/"vocab_size": 256/' "$OLDPWD/tests/golden/llama_debug/config.json" > hf_noweights/config.json
# data
printf 'tiny' > tiny.txt
head -c 1024 /dev/zero | tr '\0' 'x' > bad.bin
# adapters: copies of PEFT's adapter for the debug model, each broken one way
A="$OLDPWD/tests/golden/llama_debug_adapter"
adapter() {  # adapter NAME SED-EXPRESSION (applied to adapter_config.json)
  mkdir -p "ad_$1" && cp "$A/adapter_model.safetensors" "ad_$1/" && sed "$2" "$A/adapter_config.json" > "ad_$1/adapter_config.json"
}
mkdir -p ad_noconfig && cp "$A/adapter_model.safetensors" ad_noconfig/
adapter badjson 's/"r": 4,/"r": 4/'
adapter type 's/"peft_type": "LORA"/"peft_type": "IA3"/'
adapter r_missing '/"r": 4,/d'
adapter r_zero 's/"r": 4,/"r": 0,/'
adapter shape 's/"r": 4,/"r": 8,/'
adapter dora 's/"use_dora": false/"use_dora": true/'
adapter alpha 's/"lora_alpha": 8,/"lora_alpha": "eight",/'
adapter regex_dos '/"target_modules": \[/,/\]/c\  "target_modules": "(.*.*)*q_projX",'
adapter regex_bad '/"target_modules": \[/,/\]/c\  "target_modules": "(q_proj",'
adapter regex_backref '/"target_modules": \[/,/\]/c\  "target_modules": "(q)\\\\1_proj",'
adapter nomatch '/"target_modules": \[/,/\]/c\  "target_modules": ["no_such_proj"],'
adapter noweights 's/x/x/' && rm ad_noweights/adapter_model.safetensors
adapter trunc 's/x/x/' && truncate -s 64 ad_trunc/adapter_model.safetensors
# checkpoints: two steps of the CI recipe (step_1, step_2)
cd "$OLDPWD"
"$TRAIN" --config configs/ci/single.yaml --progress lines --set step_scheduler.max_steps=2 \
  --set step_scheduler.ckpt_every_steps=1 --set checkpoint.keep_last=0 --set checkpoint.checkpoint_dir="$FIX/ck" > "$FIX/ck.log" 2>&1
[ -f "$FIX/ck/step_2/metadata.json" ] && [ -f "$FIX/ck/step_1/metadata.json" ]
