#!/usr/bin/env python3
"""Generates tests/golden/gguf_dequant.json: reference dequantised values of a few tensors of
SmolLM2-135M-Instruct.Q4_1.gguf (types Q8_0, Q4_1, F32), computed with gguf-py (llama.cpp's
Python package, numpy dequantisation in gguf.quants). q/k weights are also given in Hugging
Face row order, undoing llama.cpp's permutation with the same formula as transformers'
GGUF loader (reverse_permute: reshape(n_head, d/2, 2, in).swapaxes(1, 2)).

Usage: /tmp/dtr-fixture-venv/bin/python tests/golden/make_gguf_fixture.py data/smollm2-135m-instruct.gguf
"""
import json
import os
import sys

import gguf
import numpy as np
from gguf.quants import dequantize

PICK = [  # (gguf name, n_head for unpermute or 0)
    ("token_embd.weight", 0),
    ("blk.0.attn_q.weight", 9),
    ("blk.0.attn_k.weight", 3),
    ("blk.0.ffn_down.weight", 0),
    ("blk.29.attn_v.weight", 0),
    ("output_norm.weight", 0),
]
SAMPLES = [0, 1, 31, 32, 33, 1000, 12345, 99999]  # flat indices (mod numel)


def reverse_permute(w, n_head):
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "data/smollm2-135m-instruct.gguf"
    r = gguf.GGUFReader(path)
    by_name = {t.name: t for t in r.tensors}
    out = {"source": os.path.basename(path), "generator": "tests/golden/make_gguf_fixture.py (gguf-py)", "tensors": []}
    for name, n_head in PICK:
        t = by_name[name]
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape.tolist())]  # PyTorch order
        w = w.reshape(shape)
        entry = {"name": name, "type": t.tensor_type.name, "shape": shape}
        variants = [("gguf_order", w)]
        if n_head:
            variants.append(("hf_order", reverse_permute(w, n_head)))
            entry["n_head"] = n_head
        for key, v in variants:
            flat = v.reshape(-1).astype(np.float64)
            entry[key] = {
                "sum": float(flat.sum()),
                "sum_abs": float(np.abs(flat).sum()),
                "row_sums_first8": [float(x) for x in v.reshape(shape[0], -1)[:8].astype(np.float64).sum(axis=1)],
                "samples": {str(i % flat.size): float(flat[i % flat.size]) for i in SAMPLES},
            }
        out["tensors"].append(entry)
    dst = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_dequant.json")
    with open(dst, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
