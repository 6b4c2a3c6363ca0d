#!/usr/bin/env python3
"""Loads a dtr-train PEFT adapter of a Qwen3-MoE (LoRA on attention and on the grouped experts,
adapter_config target_parameters) with PEFT over its Hugging Face base, and compares the logits
with transformers' load of dtr-train's merged export of the same run (checkpoint.save_consolidated).
Prints the largest |difference|; exit 1 above --atol. tests/apps/train_e2e.sh moe_lora runs it when
a venv with peft is there (dtr itself never runs Python); by hand:

  build/bin/dtr-train --config configs/ci/moe_lora.yaml --set checkpoint.save_consolidated=true
  /work/.venv-ref/bin/python tests/golden/check_peft_moe_adapter.py tests/golden/qwen3_moe_debug \\
      out/ci/moe_lora_single/adapter out/ci/moe_lora_single/consolidated
"""
import argparse
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("adapter")
    ap.add_argument("merged")
    ap.add_argument("--atol", type=float, default=1e-4)
    a = ap.parse_args()
    ids = torch.tensor([[(7 * b + 3 * t + (b * t) % 5) % 120 for t in range(16)] for b in range(2)])
    base = AutoModelForCausalLM.from_pretrained(a.base, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, a.adapter).eval()
    merged = AutoModelForCausalLM.from_pretrained(a.merged, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(a.base, dtype=torch.float32).eval()
    with torch.no_grad():
        lp, lm, lb = peft(ids).logits, merged(ids).logits, plain(ids).logits
    d = (lp - lm).abs().max().item()
    moved = (lp - lb).abs().max().item()
    wrapped = sum(1 for n, _ in peft.named_modules() if n.endswith("mlp.experts"))
    print(f"PEFT adapter vs dtr merged export: max |logit diff| {d:.3g}; the adapter moves logits by {moved:.3g}; "
          f"{wrapped} experts modules wrapped")
    sys.exit(0 if d <= a.atol and moved > 10 * a.atol else 1)


if __name__ == "__main__":
    main()
