#!/usr/bin/env python3
"""A tiny random Qwen3-MoE written as a GGUF in llama.cpp's layout (the gguf package, as
llama.cpp's convert_hf_to_gguf.py Qwen3MoeModel writes it), loaded back by transformers' GGUF
loader (from_pretrained(..., gguf_file=...)), and the logits of a fixed batch.

Writes tests/golden/qwen3_moe_gguf/:
  config.json + model.safetensors  the HF model (save_pretrained, f32)
  qwen3_moe_debug.gguf             llama.cpp layout: general.architecture qwen3moe,
                                   qwen3moe.expert_count / expert_used_count /
                                   expert_feed_forward_length, blk.N.ffn_gate_inp (router [E, H]),
                                   blk.N.ffn_{gate,up,down}_exps (numpy [E, I, H] / [E, H, I],
                                   GGUF ne reversed); layer 0's experts quantised (gate / up
                                   Q8_0, down Q4_0), everything else F32
and tests/golden/qwen3_moe_gguf.json: ids, transformers' logits of the GGUF load ("gguf_logits")
and of the HF model ("hf_logits").

transformers' GGUF config mapping for qwen3_moe does not read expert_feed_forward_length (nor
head_dim when key_length is absent), so moe_intermediate_size would stay at Qwen3MoeConfig's
default 768 and the expert weights would not fit: the script passes the config transformers
built from the GGUF with moe_intermediate_size set to the file's value (every weight still comes
from the GGUF through transformers' loader, checked against the source model below).

Usage: /work/.venv-ref/bin/python tests/golden/make_qwen3_moe_gguf_fixture.py
"""
import json
import os

import gguf
import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "qwen3_moe_gguf")
GGUF_NAME = "qwen3_moe_debug.gguf"
Q = gguf.GGMLQuantizationType


def ids():
    return torch.tensor([[(5 * b + 7 * t + (b * t) % 3) % 128 for t in range(10)] for b in range(2)])


def layer_tensors(sd, l, E):
    p = f"model.layers.{l}."
    gu = sd[p + "mlp.experts.gate_up_proj"]  # [E, 2I, H]: gate rows then up rows
    I = gu.shape[1] // 2
    yield f"blk.{l}.attn_norm.weight", sd[p + "input_layernorm.weight"]
    yield f"blk.{l}.attn_q.weight", sd[p + "self_attn.q_proj.weight"]
    yield f"blk.{l}.attn_k.weight", sd[p + "self_attn.k_proj.weight"]
    yield f"blk.{l}.attn_v.weight", sd[p + "self_attn.v_proj.weight"]
    yield f"blk.{l}.attn_output.weight", sd[p + "self_attn.o_proj.weight"]
    yield f"blk.{l}.attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"]
    yield f"blk.{l}.attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"]
    yield f"blk.{l}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]
    yield f"blk.{l}.ffn_gate_inp.weight", sd[p + "mlp.gate.weight"]
    yield f"blk.{l}.ffn_gate_exps.weight", gu[:, :I, :]
    yield f"blk.{l}.ffn_up_exps.weight", gu[:, I:, :]
    yield f"blk.{l}.ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"]


def write_gguf(cfg, sd, path):
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_name("qwen3_moe_debug")
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    tensors = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for l in range(cfg.num_hidden_layers):
        tensors += list(layer_tensors(sd, l, cfg.num_experts))
    tensors += [("output_norm.weight", sd["model.norm.weight"]), ("output.weight", sd["lm_head.weight"])]
    quant = {"blk.0.ffn_gate_exps.weight": Q.Q8_0, "blk.0.ffn_up_exps.weight": Q.Q8_0,
             "blk.0.ffn_down_exps.weight": Q.Q4_0}
    for name, t in tensors:
        a = t.detach().float().contiguous().numpy()
        if name in quant:
            w.add_tensor(name, gguf.quantize(a, quant[name]), raw_dtype=quant[name])
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return quant


def main():
    torch.manual_seed(3)
    cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                         num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         max_position_embeddings=64, tie_word_embeddings=False, rms_norm_eps=1e-6)
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 so a lost norm weight shows
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    gen = os.path.join(OUT, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    sd = model.state_dict()
    quant = write_gguf(cfg, sd, os.path.join(OUT, GGUF_NAME))

    gcfg = AutoConfig.from_pretrained(OUT, gguf_file=GGUF_NAME)
    assert gcfg.model_type == "qwen3_moe" and gcfg.num_experts == 4 and gcfg.norm_topk_prob, gcfg
    gcfg.moe_intermediate_size = cfg.moe_intermediate_size  # not in transformers' GGUF key mapping
    gm = AutoModelForCausalLM.from_pretrained(OUT, gguf_file=GGUF_NAME, config=gcfg, dtype=torch.float32).eval()
    gsd = gm.state_dict()
    assert set(gsd) == set(sd), set(gsd) ^ set(sd)
    quantised = {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"}
    for k, v in sd.items():
        if k in quantised:
            err = (gsd[k] - v).abs().max().item()
            assert 0 < err < 0.1 * v.abs().max().item(), (k, err)
        else:
            assert torch.equal(gsd[k], v), k
    x = ids()
    with torch.no_grad():
        gl = gm(x).logits
        hl = model(x).logits
    print("GGUF-load vs HF logits max diff (quantised experts of layer 0):", (gl - hl).abs().max().item())
    with open(os.path.join(HERE, "qwen3_moe_gguf.json"), "w") as f:
        json.dump({"ids": x.flatten().tolist(), "shape": list(x.shape), "gguf_logits": gl.flatten().tolist(),
                   "hf_logits": hl.flatten().tolist(), "quantised": {k: v.name for k, v in quant.items()}}, f)


if __name__ == "__main__":
    main()
