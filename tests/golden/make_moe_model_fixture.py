#!/usr/bin/env python3
"""Tiny random Qwen3-MoE and Mixtral causal LMs from transformers (f32, save_pretrained into
tests/golden/{qwen3_moe,mixtral}_debug/) and tests/golden/moe_models.json: logits of a fixed
batch and the loss with labels plus router_aux_loss_coef * load_balancing_loss.

Usage: /work/.venv-ref/bin/python tests/golden/make_moe_model_fixture.py
"""
import json
import os

import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))


def ids():
    return torch.tensor([[(7 * b + 3 * t + (b * t) % 5) % 128 for t in range(12)] for b in range(2)])


def run(name, model):
    torch.manual_seed(0)
    model.eval()
    d = os.path.join(HERE, name + "_debug")
    model.save_pretrained(d, safe_serialization=True)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    x = ids()
    with torch.no_grad():
        out = model(x, labels=x, output_router_logits=True)
    return {"ids": x.flatten().tolist(), "shape": list(x.shape), "logits": out.logits.flatten().tolist(),
            "loss": float(out.loss), "aux_loss": float(out.aux_loss)}


def main():
    torch.manual_seed(1)
    q = Qwen3MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                       num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                       router_aux_loss_coef=0.01, max_position_embeddings=64, tie_word_embeddings=False)
    res = {"qwen3_moe": run("qwen3_moe", Qwen3MoeForCausalLM(q))}
    torch.manual_seed(2)
    m = MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                      max_position_embeddings=64, sliding_window=None, tie_word_embeddings=False)
    res["mixtral"] = run("mixtral", MixtralForCausalLM(m))
    with open(os.path.join(HERE, "moe_models.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
