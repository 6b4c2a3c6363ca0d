#!/usr/bin/env python3
"""Reference fixtures for dtr's model families (Qwen2, Qwen3, Mistral, Gemma 3), made with Hugging
Face transformers (python is only used here, to make fixtures).

For each family a tiny random model (the configs below: each exercises what the family adds to
Llama) is saved with save_pretrained (config.json + model.safetensors, f32) under
tests/golden/<family>_debug/. Norm weights and biases are redrawn at random after HF's init
(which sets them to 1 / 0) so that they matter. tests/golden/families_debug.json holds, per family:
logits of a fixed batch (T = 12 > the sliding windows, so the windows cut), the loss with labels
(HF shifts them; -100 ignored), gradient norms of every parameter and the full gradient of one
norm weight.

  qwen2    q/k/v bias (o_proj none), use_sliding_window with max_window_layers 1 (layers 1, 2
           slide, window 5), 3 layers, 4 heads / 2 kv heads
  qwen3    q_norm / k_norm, head_dim 24 (not hidden / heads), tied embeddings, 4 / 2 heads
  mistral  sliding window 5 on every layer, 4 heads / 1 kv head
  gemma3   GeGLU, (1 + w) norms, four norms per layer, q/k norms, sqrt(hidden) embedding scale,
           head_dim 32, layer_types [sliding, full, sliding] with rope bases 10000 / 1e6,
           query_pre_attn_scalar 24, final_logit_softcapping 2, tied, 4 heads / 1 kv head

Check that transformers loads a GGUF written by dtr (dtr-convert hf-to-gguf or the round-trip
test) and gives the stored logits:
    python make_families_fixture.py --check-dtr-gguf FAMILY FILE.gguf

Check that dtr imports a PEFT LoRA adapter of every family and that its merged export loads in
transformers (dtr-convert merge-adapter; logits equal PEFT's on the fixture batch):
    python make_families_fixture.py --check-dtr-merge build/bin/dtr-convert

Usage (the reference venv: torch, transformers, safetensors, numpy):
    /work/.venv-ref/bin/python tests/golden/make_families_fixture.py
"""
import argparse
import json
import os
import sys

import torch
import transformers
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_llama_fixture import debug_batch  # noqa: E402  (the same [2, 12] batch as the Llama fixture)
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, max_position_embeddings=128,
              rms_norm_eps=1e-6, initializer_range=0.02, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def configs():
    return {
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            **COMMON, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            use_sliding_window=True, sliding_window=5, max_window_layers=1, tie_word_embeddings=False,
            rope_theta=10000.0)),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(
            **COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
            tie_word_embeddings=True, attention_bias=False, rope_theta=1000000.0)),
        "mistral": (MistralForCausalLM, MistralConfig(
            **COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            sliding_window=5, tie_word_embeddings=False, rope_theta=10000.0)),
        "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig(
            **COMMON, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
            query_pre_attn_scalar=24, sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
            final_logit_softcapping=2.0, tie_word_embeddings=True)),
    }


def make(name, cls, cfg):
    torch.manual_seed(1234)
    cfg._attn_implementation = "eager"
    model = cls(cfg).float().eval()
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():  # norms and biases away from their 1 / 0 init so that they matter
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (0.0 if name == "gemma3" else 1.0))
            elif n.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    out_dir = os.path.join(HERE, f"{name}_debug")
    model.config.name_or_path = f"dtr-{name}-debug"
    model.save_pretrained(out_dir, safe_serialization=True)
    gen = os.path.join(out_dir, "generation_config.json")  # not needed by dtr
    if os.path.exists(gen):
        os.remove(gen)
    ids, labels = debug_batch()
    res = model(input_ids=ids, labels=labels)
    res.loss.backward()
    norm_name = "model.layers.0.self_attn.k_norm.weight" if name in ("qwen3", "gemma3") else "model.norm.weight"
    params = dict(model.named_parameters())
    print(f"{name}: loss {res.loss.item():.6f} -> {out_dir}")
    return {
        "input_ids": ids.tolist(),
        "labels": labels.tolist(),
        "logits": res.logits.detach().reshape(-1).tolist(),
        "logits_shape": list(res.logits.shape),
        "loss": res.loss.item(),
        "grad_norms": {n: p.grad.norm().item() for n, p in params.items()},
        "norm_grad_name": norm_name,
        "norm_grad": params[norm_name].grad.tolist(),
    }


def check_dtr_gguf(name, path):
    with open(os.path.join(HERE, "families_debug.json")) as fh:
        ref = json.load(fh)[name]
    d, f = os.path.split(os.path.abspath(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ref["input_ids"])).logits.reshape(-1)
    diff = (logits - torch.tensor(ref["logits"])).abs().max().item()
    print(f"transformers loaded {path} as {type(model).__name__}: max |logits - fixture| = {diff:.3e}")
    return 0 if diff < 1e-4 else 1


def check_dtr_merge(dtr_convert):
    import subprocess
    import tempfile
    from peft import LoraConfig, get_peft_model
    with open(os.path.join(HERE, "families_debug.json")) as fh:
        ref = json.load(fh)
    worst = 0.0
    for name in configs():
        base = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(HERE, f"{name}_debug"),
                                                                 dtype=torch.float32).eval()
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"], lora_dropout=0.0)
        pm = get_peft_model(base, cfg)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        ids = torch.tensor(ref[name]["input_ids"])
        with torch.no_grad():
            want = pm(input_ids=ids).logits
        with tempfile.TemporaryDirectory() as tmp:
            pm.save_pretrained(os.path.join(tmp, "adapter"))
            subprocess.run([dtr_convert, "merge-adapter", os.path.join(HERE, f"{name}_debug"),
                            os.path.join(tmp, "adapter"), os.path.join(tmp, "merged")], check=True)
            merged = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(tmp, "merged"),
                                                                       dtype=torch.float32).eval()
            with torch.no_grad():
                got = merged(input_ids=ids).logits
        d = (got - want).abs().max().item()
        worst = max(worst, d)
        print(f"{name}: dtr merged export loaded as {type(merged).__name__}: max |logits - PEFT| = {d:.3e}")
    return 0 if worst < 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-dtr-gguf", nargs=2, metavar=("FAMILY", "GGUF"))
    ap.add_argument("--check-dtr-merge", metavar="DTR_CONVERT")
    a = ap.parse_args()
    torch.set_num_threads(2)
    if a.check_dtr_gguf:
        sys.exit(check_dtr_gguf(*a.check_dtr_gguf))
    if a.check_dtr_merge:
        sys.exit(check_dtr_merge(a.check_dtr_merge))
    out = {"tool": f"torch {torch.__version__}, transformers {transformers.__version__}"}
    for name, (cls, cfg) in configs().items():
        out[name] = make(name, cls, cfg)
    with open(os.path.join(HERE, "families_debug.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
