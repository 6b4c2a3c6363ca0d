#!/usr/bin/env python3
"""PyTorch reference for `dtr-bench train-step --model CONFIG`: the training step of any family
(Gemma 3, Qwen3, ...) as its users run it in transformers.

Model: transformers' own class for the config.json that dtr-bench wrote (--save-config), i.e.
AutoModelForCausalLM.from_config (Gemma3ForCausalLM for model_type gemma3_text,
Qwen3ForCausalLM for qwen3), attn_implementation "sdpa", float32, random init by HF's
_init_weights (N(0, initializer_range), norms 1, Gemma's (1 + w) norms 0), train mode, no cache.
Loss: the model's own, model(input_ids, labels=labels).loss (HF shifts the labels: logits of
all positions are computed, the last one is ignored); ids and labels uniform random, separate
draws. LoRA: peft's get_peft_model with LoraConfig(r, lora_alpha, target_modules q,k,v,o,gate,
up,down, lora_dropout 0, bias none) (A Kaiming-uniform, B zeros); every other parameter frozen.
--full-ft: no LoRA, every parameter trainable. Optimizer: torch.optim.AdamW(lr 1e-4, weight decay
0.01, fused where available: torch_llama_lora.make_optimizer).

Output: a phase table, then as the LAST stdout line one JSON object with the fields of
torch_llama_lora.py (step_ms_median, tokens_per_s, model_flops_per_step, peak_rss_mib, phases,
params_total, params_trainable, initial_loss, final_loss, ln_vocab, ...).

Model FLOPs per step: model_flops() below, the formula of dtr's models/transformer/flops.h
(bench/compare/README.md): T = batch x seq tokens, D = the config's head_dim, N = q [H D, h],
k, v [KV D, h], o [h, H D], gate, up, down [I, h] of every layer + lm_head [vocab, h];
Nl = r x (in + out) of each adapter; attention 12 x H x D x T x sum over layers of keys, keys =
seq, or min(seq, sliding_window) on a sliding-attention layer (the band the kernel computes).
  LoRA: 4NT + 6 Nl T + attention      full FT: 6NT + attention
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama_lora import make_optimizer, parse_args as llama_parse_args, timed_steps  # noqa: E402  (no torch import at module level)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv=None):
    """--config, then the run flags of torch_llama_lora.py (--seq --batch --lora-rank --lora-alpha
    --steps --warmup --threads --full-ft --seed --adamw); its Llama shape flags are refused."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="config.json written by dtr-bench train-step --save-config")
    a, rest = p.parse_known_args(argv)
    llama_only = {"--layers", "--hidden", "--intermediate", "--heads", "--kv-heads", "--vocab", "--rope-theta",
                  "--rms-eps", "--gqa", "--fsdp", "--ddp"}
    for x in rest:
        if x.split("=")[0] in llama_only:
            p.error(f"{x}: not a flag of this script (the shape comes from --config; single process only)")
    run = llama_parse_args(rest)
    run.config = a.config
    return run


def is_sliding(cfg, layer):
    """Layer `layer` slides: layer_types (Gemma 3, transformers 5), else Qwen's use_sliding_window
    from max_window_layers on, else Mistral's sliding_window on every layer."""
    types = cfg.get("layer_types")
    if types:
        return types[layer] == "sliding_attention"
    if "use_sliding_window" in cfg:
        return bool(cfg["use_sliding_window"]) and layer >= cfg.get("max_window_layers", 0)
    return bool(cfg.get("sliding_window"))


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def attention_flops(cfg, seq, batch, world=1):
    """The attention term: 12 x H x D x T x keys summed over the layers (module docstring)."""
    w = cfg.get("sliding_window") or 0
    keys = sum(min(seq, w) if w and is_sliding(cfg, l) else seq for l in range(cfg["num_hidden_layers"]))
    return 12 * cfg["num_attention_heads"] * head_dim(cfg) * keys * batch * seq * world


def model_flops(cfg, seq, batch, lora_rank, full_ft, world=1):
    """Model FLOPs of one training step of the config.json dict `cfg` (module docstring)."""
    h, f, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    q, kv = H * head_dim(cfg), KV * head_dim(cfg)
    N = L * (h * q + 2 * h * kv + q * h + 3 * h * f) + V * h
    Nl = L * lora_rank * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h))
    T = batch * seq * world
    return (6 * N * T if full_ft else 4 * N * T + 6 * Nl * T) + attention_flops(cfg, seq, batch, world)


def build(a, cfg, torch):
    from transformers import AutoConfig, AutoModelForCausalLM

    d = dict(cfg)
    hf_cfg = AutoConfig.for_model(d.pop("model_type"), **{k: v for k, v in d.items() if k != "architectures"})
    hf_cfg.use_cache = False
    model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    if not a.full_ft:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0,
                                                 bias="none", target_modules=TARGETS))
    return model


def main():
    a = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch

    torch.set_num_threads(a.threads)
    with open(a.config) as fh:
        cfg = json.load(fh)
    torch.manual_seed(a.seed)
    model = build(a, cfg, torch)
    cls = type(model.get_base_model() if hasattr(model, "get_base_model") else model).__name__
    params_total = sum(p.numel() for p in model.parameters())  # a tied weight once
    params_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt, adamw_impl = make_optimizer(a, torch, [p for p in model.parameters() if p.requires_grad])
    V = cfg["vocab_size"]
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, V, (a.batch, a.seq), generator=g)
    labels = torch.randint(0, V, (a.batch, a.seq), generator=g)

    fwd, bwd, optm, steps, losses = timed_steps(a, lambda: model(input_ids=ids, labels=labels).loss, opt)

    step_ms, f_ms, b_ms, o_ms = (statistics.median(x) * 1e3 for x in (steps, fwd, bwd, optm))
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    tokens = a.batch * a.seq
    flops = model_flops(cfg, a.seq, a.batch, a.lora_rank, a.full_ft)
    out = {
        "impl": "pytorch", "torch_version": torch.__version__, "model_class": cls,
        "mode": "full_ft" if a.full_ft else "lora", "dist": "none", "world_size": 1, "threads": a.threads,
        "adamw": adamw_impl, "attn_implementation": "sdpa",
        "step_ms_median": step_ms, "tokens_per_step": tokens, "tokens_per_s": tokens / (step_ms / 1e3),
        "model_flops_per_step": flops, "attention_flops_per_step": attention_flops(cfg, a.seq, a.batch),
        "model_gflops_per_s": flops / (step_ms / 1e3) * 1e-9,
        "peak_rss_mib": rss_mib, "params_total": params_total, "params_trainable": params_trainable,
        "initial_loss": losses[0], "final_loss": losses[-1], "ln_vocab": math.log(V),
        "phases": {"forward_ms": f_ms, "backward_ms": b_ms, "optimizer_ms": o_ms, "comm_exposed_ms": 0.0},
    }
    print(f"pytorch {torch.__version__} {cls} (sdpa) train step: layers {cfg['num_hidden_layers']} seq {a.seq} "
          f"batch {a.batch}, {out['mode']}, threads {a.threads}, AdamW {adamw_impl}")
    print(f"params {params_total} (trainable {params_trainable}), loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(ln vocab {math.log(V):.4f})")
    for name, v in (("forward", f_ms), ("backward", b_ms), ("optimizer", o_ms)):
        print(f"{name:<12} {v:>12.1f} {100 * v / step_ms:>6.1f}%")
    print(f"{'step':<12} {step_ms:>12.1f}   tokens/s {out['tokens_per_s']:.0f}  peak RSS {rss_mib:.0f} MiB")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
