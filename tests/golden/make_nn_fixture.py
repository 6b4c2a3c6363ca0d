#!/usr/bin/env python3
"""Writes nn_ops.json: PyTorch (CPU, float64) outputs and gradients of the nn functional ops
for fixed small inputs, read by tests/tensor/test_nn_golden.cpp.

Inputs are deterministic sin/cos patterns (no RNG). Each gradient is d/dinput of
sum(out * w) with w = cos(0.37 * i + 0.1) over the output's flat index i.

Usage: python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch
       /tmp/venv/bin/python tests/golden/make_nn_fixture.py
"""
import json
import math
import os

import torch

torch.set_default_dtype(torch.float64)


def pat(shape, a=0.7, b=0.3, amp=1.0, f=torch.sin):
    n = math.prod(shape)
    return (f(torch.arange(n, dtype=torch.float64) * a + b) * amp).reshape(shape)


def weight_for(out):
    return pat(out.shape, 0.37, 0.1, 1.0, torch.cos)


def T(t):
    t = t.detach()
    return {"shape": list(t.shape), "data": [float(x) if t.is_floating_point() else int(x) for x in t.flatten().tolist()]}


def grads(out, inputs):
    out.backward(weight_for(out))
    g = [x.grad.clone() for x in inputs]
    for x in inputs:
        x.grad = None
    return g


fx = {}

# softmax / log_softmax over dim 1 and dim 0
for dim in (1, 0):
    x = pat((3, 5), amp=3.0).requires_grad_()
    for name, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        y = fn(x, dim)
        (gx,) = grads(y, [x])
        fx[f"{name}_dim{dim}"] = {"dim": dim, "x": T(x), "out": T(y), "dx": T(gx)}

# rms_norm: HF LlamaRMSNorm
x = pat((2, 3, 8), amp=2.0).requires_grad_()
w = pat((8,), 0.5, 1.0, 0.5, torch.cos).add(1.0).detach().requires_grad_()
eps = 1e-6
y = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
gx, gw = grads(y, [x, w])
fx["rms_norm"] = {"eps": eps, "x": T(x), "weight": T(w), "out": T(y), "dx": T(gx), "dweight": T(gw)}

# rope: HF LlamaRotaryEmbedding tables (float32) + apply_rotary_pos_emb (rotate-half)
Tn, D, theta, pos0 = 5, 8, 10000.0, 3
inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
pos = torch.arange(pos0, pos0 + Tn, dtype=torch.int64).float()
freqs = (inv_freq[:, None].float() @ pos[None, :].float()).transpose(0, 1)
emb = torch.cat((freqs, freqs), dim=-1)
cos32, sin32 = emb.cos(), emb.sin()


def rotate_half(t):
    t1, t2 = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2 :]
    return torch.cat((-t2, t1), dim=-1)


x = pat((1, 2, Tn, D), amp=1.5).requires_grad_()
cos, sin = cos32.double(), sin32.double()
y = x * cos + rotate_half(x) * sin
(gx,) = grads(y, [x])
fx["rope"] = {"T": Tn, "D": D, "theta": theta, "pos0": pos0, "cos_f32": T(cos32.double()), "sin_f32": T(sin32.double()),
              "x": T(x), "out": T(y), "dx": T(gx)}

# sdpa with GQA (Hq=4, Hkv=2), S > T, causal bottom-right aligned and not causal
B, Hq, Hkv, Tq, S, Dh = 2, 4, 2, 3, 5, 4
for causal in (True, False):
    q = pat((B, Hq, Tq, Dh), 0.31, 0.2, 1.2).requires_grad_()
    k = pat((B, Hkv, S, Dh), 0.53, 0.7, 1.1).requires_grad_()
    v = pat((B, Hkv, S, Dh), 0.29, 1.3, 1.0, torch.cos).requires_grad_()
    rep = Hq // Hkv
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    mask = torch.ones(Tq, S, dtype=torch.bool).tril(diagonal=S - Tq) if causal else None
    y = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
    gq, gk, gv = grads(y, [q, k, v])
    fx["sdpa_causal" if causal else "sdpa_full"] = {"causal": causal, "q": T(q), "k": T(k), "v": T(v), "out": T(y),
                                                    "dq": T(gq), "dk": T(gk), "dv": T(gv)}

# cross_entropy with ignore_index
logits = pat((5, 7), 0.9, 0.1, 2.5).requires_grad_()
targets = torch.tensor([2, -100, 6, 0, -100], dtype=torch.int64)
loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
loss.backward()
fx["cross_entropy"] = {"ignore_index": -100, "logits": T(logits), "targets": T(targets), "loss": float(loss.detach()),
                       "dlogits": T(logits.grad)}

# embedding
weight = pat((6, 4), 0.45, 0.0, 1.0).requires_grad_()
ids = torch.tensor([[1, 5, 1], [0, 2, 5]], dtype=torch.int64)
y = torch.nn.functional.embedding(ids, weight)
(gw,) = grads(y, [weight])
fx["embedding"] = {"ids": T(ids), "weight": T(weight), "out": T(y), "dweight": T(gw)}

fx["_meta"] = {"torch": torch.__version__, "script": "tests/golden/make_nn_fixture.py",
               "grad_weight": "w[i] = cos(0.37 * i + 0.1) over the output's flat index"}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nn_ops.json")
with open(path, "w") as f:
    json.dump(fx, f, indent=1, sort_keys=True)
print("wrote", path)
