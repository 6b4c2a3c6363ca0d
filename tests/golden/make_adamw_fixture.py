#!/usr/bin/env python3
"""Writes adamw_fixture.json: 10 steps of torch.optim.AdamW on a fixed problem.

Two parameters, w [3, 4] and b [5]. Initial values and the gradient of every step come from
deterministic formulas evaluated here in Python doubles and are stored in the JSON, so the C++
test (tests/tensor/test_optim.cpp) needs no formula of its own. At step 4 b has no gradient
(grad None): torch skips it, its step count does not advance.
Hyperparameters: lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1.
Results are recorded for float64 and float32 parameters (torch CPU, default single-tensor path).

Usage: python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch
       /tmp/venv/bin/python tests/golden/make_adamw_fixture.py
"""
import json
import math
import os

import torch

SHAPES = {"w": [3, 4], "b": [5]}
STEPS = 10
HP = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
NO_GRAD = {("b", 4)}


def numel(shape):
    return math.prod(shape)


def init_values(k, name):
    return [math.sin(0.7 * i + 0.3 + k) for i in range(numel(SHAPES[name]))]


def grad_values(k, name, step):
    return [math.cos(0.37 * i + 0.11 * step + k) * (1.0 + 0.5 * step) for i in range(numel(SHAPES[name]))]


def run(dtype):
    params = {}
    for k, name in enumerate(SHAPES):
        t = torch.tensor(init_values(k, name), dtype=torch.float64).reshape(SHAPES[name]).to(dtype)
        params[name] = t.requires_grad_(True)
    opt = torch.optim.AdamW(list(params.values()), foreach=False, **HP)
    history = []
    for step in range(1, STEPS + 1):
        for k, name in enumerate(SHAPES):
            p = params[name]
            if (name, step) in NO_GRAD:
                p.grad = None
            else:
                p.grad = torch.tensor(grad_values(k, name, step), dtype=torch.float64).reshape(p.shape).to(dtype)
        opt.step()
        history.append({name: [float(x) for x in p.detach().double().flatten()] for name, p in params.items()})
    return history


def main():
    grads = []
    for step in range(1, STEPS + 1):
        grads.append({name: (None if (name, step) in NO_GRAD else grad_values(k, name, step))
                      for k, name in enumerate(SHAPES)})
    fixture = {
        "source": "torch.optim.AdamW (torch %s), foreach=False" % torch.__version__,
        "hyperparameters": {"lr": HP["lr"], "beta1": HP["betas"][0], "beta2": HP["betas"][1], "eps": HP["eps"],
                            "weight_decay": HP["weight_decay"]},
        "shapes": SHAPES,
        "init": {name: init_values(k, name) for k, name in enumerate(SHAPES)},
        "grads": grads,
        "params_f64": run(torch.float64),
        "params_f32": run(torch.float32),
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adamw_fixture.json")
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
