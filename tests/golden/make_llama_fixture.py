#!/usr/bin/env python3
"""Reference fixtures for dtr's Llama model and LoRA / PEFT code, made with Hugging Face
transformers + PEFT (python is only used here, to make fixtures).

(a) tests/golden/llama_debug/            a small random transformers LlamaForCausalLM (the
    config of dtr::llama_debug_config(): vocab 128, hidden 64, intermediate 96, 2 layers,
    4 heads / 2 kv heads, head_dim 16, untied), saved with save_pretrained (config.json +
    model.safetensors, f32), and tests/golden/llama_debug.json: logits of a fixed batch,
    the loss with labels (HF shifts them; -100 ignored), gradient norms of a few parameters
    and the full gradient of model.norm.weight.
(b) tests/golden/smollm2_logits.json     when data/smollm2-135m-instruct.gguf exists
    (scripts/fetch-model.sh): transformers loads the GGUF (from_pretrained(gguf_file=...),
    weights dequantised to f32 by gguf-py), tokenizes 3 prompts with the tokenizer of the
    same GGUF and stores the top-10 logits of the last position, and the loss of a fixed
    2 x 24 batch.
(c) tests/golden/llama_debug_adapter/    a PEFT LoRA adapter (r 4, alpha 8, targets
    q/k/v/o/gate/up/down_proj, dropout 0) on (a) with deterministic nonzero A and B:
    for the k-th adapted module in sorted FQN order, element i (row-major) of
      lora_A.weight = 0.05 * sin(0.7 * i + 1.3 * k)
      lora_B.weight = 0.05 * cos(0.3 * i + 0.9 * k)
    (computed in float64, stored as float32), written by PEFT's save_pretrained; and in
    llama_debug.json the logits with that adapter, plain and with use_rslora.

Check that PEFT loads an adapter written by dtr and gives the stored logits:
    python make_llama_fixture.py --check-dtr-adapter DIR

Usage (venv under /tmp with torch, transformers, peft, gguf, safetensors, numpy):
    /tmp/venv-llama/bin/python tests/golden/make_llama_fixture.py
"""
import argparse
import copy
import json
import math
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEBUG_DIR = os.path.join(HERE, "llama_debug")
ADAPTER_DIR = os.path.join(HERE, "llama_debug_adapter")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GRAD_PARAMS = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
]


def debug_config():
    return LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
        mlp_bias=False, bos_token_id=1, eos_token_id=2, initializer_range=0.02)


def debug_batch():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 128, (2, 12), generator=g)
    labels = ids.clone()
    labels[1, :4] = -100  # prompt tokens of row 1 carry no loss
    labels[0, 7] = -100
    return ids, labels


def lora_values(shape, k, kind):
    n = shape[0] * shape[1]
    i = torch.arange(n, dtype=torch.float64)
    v = 0.05 * (torch.sin(0.7 * i + 1.3 * k) if kind == "A" else torch.cos(0.3 * i + 0.9 * k))
    return v.reshape(shape).to(torch.float32)


def peft_model(base, rslora):
    from peft import LoraConfig, get_peft_model
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM", use_rslora=rslora)
    pm = get_peft_model(copy.deepcopy(base), cfg)
    mods = {}
    for name, m in pm.named_modules():
        if hasattr(m, "lora_A") and isinstance(getattr(m, "lora_A"), torch.nn.ModuleDict) and "default" in m.lora_A:
            mods[name.removeprefix("base_model.model.")] = m
    with torch.no_grad():
        for k, fqn in enumerate(sorted(mods)):
            a = mods[fqn].lora_A["default"].weight
            b = mods[fqn].lora_B["default"].weight
            a.copy_(lora_values(tuple(a.shape), k, "A"))
            b.copy_(lora_values(tuple(b.shape), k, "B"))
    return pm.eval(), sorted(mods)


def make_debug(out):
    torch.manual_seed(1234)
    model = LlamaForCausalLM(debug_config()).float().eval()
    model.config.name_or_path = "dtr-llama-debug"
    model.save_pretrained(DEBUG_DIR, safe_serialization=True)
    gen = os.path.join(DEBUG_DIR, "generation_config.json")  # not needed by dtr
    if os.path.exists(gen):
        os.remove(gen)
    ids, labels = debug_batch()
    res = model(input_ids=ids, labels=labels)
    res.loss.backward()
    params = dict(model.named_parameters())
    out["debug"] = {
        "input_ids": ids.tolist(),
        "labels": labels.tolist(),
        "logits": res.logits.detach().reshape(-1).tolist(),
        "logits_shape": list(res.logits.shape),
        "loss": res.loss.item(),
        "grad_norms": {n: params[n].grad.norm().item() for n in GRAD_PARAMS},
        "norm_weight_grad": params["model.norm.weight"].grad.tolist(),
    }
    model.zero_grad()
    with torch.no_grad():
        pm, fqns = peft_model(model, rslora=False)
        out["debug"]["lora_fqns"] = fqns
        out["debug"]["logits_lora"] = pm(input_ids=ids).logits.reshape(-1).tolist()
        pm.save_pretrained(ADAPTER_DIR)
        readme = os.path.join(ADAPTER_DIR, "README.md")  # PEFT's model card: not needed
        if os.path.exists(readme):
            os.remove(readme)
        pm2, _ = peft_model(model, rslora=True)
        out["debug"]["logits_lora_rslora"] = pm2(input_ids=ids).logits.reshape(-1).tolist()
    print("debug: loss", res.loss.item(), "->", DEBUG_DIR, ADAPTER_DIR)


def make_smollm2(path):
    d, f = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    prompts = [
        "The capital of France is",
        "def fibonacci(n):\n    if n <",
        "<|im_start|>user\nWhat is Perl?<|im_end|>\n<|im_start|>assistant\n",
    ]
    text = ("Perl is a highly capable, feature-rich programming language with over thirty years of "
            "development. It runs on many platforms, from portable devices to mainframes, and is "
            "suitable for both rapid prototyping and large scale development projects. Perl borrows "
            "features from other languages, including C, shell scripting, AWK and sed.")
    res = {"gguf": os.path.basename(path), "prompts": []}
    with torch.no_grad():
        for p in prompts:
            ids = tok(p, add_special_tokens=False)["input_ids"]
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 10)
            res["prompts"].append({"text": p, "input_ids": ids, "top_ids": top.indices.tolist(),
                                   "top_logits": top.values.tolist(),
                                   "logsumexp": torch.logsumexp(logits, 0).item()})
        ids = tok(text, add_special_tokens=False)["input_ids"][:48]
        batch = torch.tensor([ids[:24], ids[24:48]])
        out = model(input_ids=batch, labels=batch)
        res["loss_batch"] = batch.tolist()
        res["loss"] = out.loss.item()
    with open(os.path.join(HERE, "smollm2_logits.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print("smollm2: loss", res["loss"], [p["top_ids"][0] for p in res["prompts"]])


def check_dtr_adapter(adapter_dir):
    from peft import PeftModel
    with open(os.path.join(HERE, "llama_debug.json")) as fh:
        ref = json.load(fh)["debug"]
    base = LlamaForCausalLM.from_pretrained(DEBUG_DIR, dtype=torch.float32).eval()
    pm = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        logits = pm(input_ids=torch.tensor(ref["input_ids"])).logits.reshape(-1)
    diff = (logits - torch.tensor(ref["logits_lora"])).abs().max().item()
    print(f"PEFT loaded {adapter_dir}: max |logits - logits_lora| = {diff:.3e}")
    return 0 if diff < 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(ROOT, "data", "smollm2-135m-instruct.gguf"))
    ap.add_argument("--check-dtr-adapter", default=None)
    a = ap.parse_args()
    torch.set_num_threads(2)
    if a.check_dtr_adapter:
        sys.exit(check_dtr_adapter(a.check_dtr_adapter))
    out = {"tool": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
                   f"peft {__import__('peft').__version__}"}
    make_debug(out)
    with open(os.path.join(HERE, "llama_debug.json"), "w") as fh:
        json.dump(out, fh)
    if os.path.exists(a.gguf):
        make_smollm2(a.gguf)
    else:
        print("WARN: no", a.gguf, "- smollm2_logits.json not regenerated (run scripts/fetch-model.sh)")


if __name__ == "__main__":
    main()
