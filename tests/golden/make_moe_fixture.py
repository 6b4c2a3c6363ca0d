#!/usr/bin/env python3
"""Writes moe_blocks.json: transformers' sparse MoE blocks (CPU, float64) on tiny random
configs, outputs and gradients, read by tests/tensor/test_moe_golden.cpp:
  qwen3_moe   Qwen3MoeSparseMoeBlock, norm_topk_prob true       (E 6, top-2, hidden 8, I 5)
  qwen3_nonorm  the same with norm_topk_prob false               (E 5, top-3)
  mixtral     MixtralSparseMoeBlock (always renormalised)        (E 4, top-2)
  qwen2_moe   Qwen2MoeSparseMoeBlock: + shared expert (gated MLP) with its sigmoid gate
  qwen3_lora  Qwen3MoeSparseMoeBlock with PEFT LoRA on experts.gate_up_proj and experts.down_proj
              (target_parameters, r 2, alpha 6; A and B U(-0.5, 0.5)): "adapter" holds
              get_peft_model_state_dict, "grads" the adapters' gradients under the same keys
Every parameter is U(-0.5, 0.5) from torch.manual_seed; the input is [2, 5, hidden] N(0, 1).
Gradients are of sum(out * w), w = cos(0.37 i + 0.1) over the output's flat index, for the
input and every parameter (by HF name). Also the router logits (for the aux-loss check) and HF's
load_balancing_loss_func over them.

Usage: /work/.venv-ref/bin/python tests/golden/make_moe_fixture.py
"""
import json
import math
import os

import torch
from transformers.models.mixtral.configuration_mixtral import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen2_moe.configuration_qwen2_moe import Qwen2MoeConfig
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock, load_balancing_loss_func

torch.set_default_dtype(torch.float64)


def T(t):
    t = t.detach()
    return {"shape": list(t.shape), "data": [float(x) for x in t.flatten().tolist()]}


def case(block, hidden, experts, top_k, seed):
    torch.manual_seed(seed)
    block = block.double()
    with torch.no_grad():
        for p in block.parameters():
            p.uniform_(-0.5, 0.5)
    x = torch.randn(2, 5, hidden, requires_grad=True)
    logits = torch.nn.functional.linear(x.reshape(-1, hidden), block.gate.weight)
    out = block(x)
    out = out[0] if isinstance(out, tuple) else out
    n = out.numel()
    w = torch.cos(torch.arange(n, dtype=torch.float64) * 0.37 + 0.1).reshape(out.shape)
    (out * w).sum().backward()
    aux = load_balancing_loss_func((logits.detach(),), experts, top_k)
    return {
        "x": T(x), "out": T(out), "dx": T(x.grad), "router_logits": T(logits), "aux_loss": float(aux),
        "params": {k: T(v) for k, v in block.named_parameters()},
        "grads": {k: T(v.grad) for k, v in block.named_parameters()},
    }


def lora_case(seed):
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model
    torch.manual_seed(seed)
    c = Qwen3MoeConfig(hidden_size=8, moe_intermediate_size=5, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    block = Qwen3MoeSparseMoeBlock(c).double()
    with torch.no_grad():
        for p in block.parameters():
            p.uniform_(-0.5, 0.5)
    base = {k: T(v) for k, v in block.named_parameters()}
    cfg = LoraConfig(r=2, lora_alpha=6, target_modules=[], target_parameters=["experts.gate_up_proj", "experts.down_proj"])
    block = inject_adapter_in_model(cfg, block)
    with torch.no_grad():
        for k, p in block.named_parameters():
            if "lora_" in k:
                p.uniform_(-0.5, 0.5)
    x = torch.randn(2, 5, 8, requires_grad=True)
    out = block(x)
    w = torch.cos(torch.arange(out.numel(), dtype=torch.float64) * 0.37 + 0.1).reshape(out.shape)
    (out * w).sum().backward()
    named = dict(block.named_parameters())
    adapter = get_peft_model_state_dict(block)
    grads = {k: T(named[k.replace(".weight", ".default.weight")].grad) for k in adapter}
    return {"x": T(x), "out": T(out), "dx": T(x.grad), "params": base, "adapter": {k: T(v) for k, v in adapter.items()},
            "grads": grads, "experts": 4, "top_k": 2, "norm": True, "I": 5, "r": 2, "alpha": 6}


def main():
    cases = {}
    c = Qwen3MoeConfig(hidden_size=8, moe_intermediate_size=5, num_experts=6, num_experts_per_tok=2, norm_topk_prob=True)
    cases["qwen3_moe"] = dict(case(Qwen3MoeSparseMoeBlock(c), 8, 6, 2, 1), experts=6, top_k=2, norm=True, I=5)
    c = Qwen3MoeConfig(hidden_size=8, moe_intermediate_size=5, num_experts=5, num_experts_per_tok=3, norm_topk_prob=False)
    cases["qwen3_nonorm"] = dict(case(Qwen3MoeSparseMoeBlock(c), 8, 5, 3, 2), experts=5, top_k=3, norm=False, I=5)
    c = MixtralConfig(hidden_size=8, intermediate_size=5, num_local_experts=4, num_experts_per_tok=2)
    cases["mixtral"] = dict(case(MixtralSparseMoeBlock(c), 8, 4, 2, 3), experts=4, top_k=2, norm=True, I=5)
    c = Qwen2MoeConfig(hidden_size=8, moe_intermediate_size=5, shared_expert_intermediate_size=7, num_experts=4,
                       num_experts_per_tok=2, norm_topk_prob=False)
    cases["qwen2_moe"] = dict(case(Qwen2MoeSparseMoeBlock(c), 8, 4, 2, 4), experts=4, top_k=2, norm=False, I=5,
                              shared_I=7)
    cases["qwen3_lora"] = lora_case(5)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_blocks.json")
    with open(path, "w") as f:
        json.dump(cases, f)
    print("wrote", path)


if __name__ == "__main__":
    main()
