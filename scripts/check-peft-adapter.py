#!/usr/bin/env python3
"""dtr-train's PEFT adapter of a Gemma 3 GGUF base, loaded in PEFT, against dtr's own forward.

dtr-train (model.path a GGUF) writes the adapter (checkpoint.adapter_dir) and the HF export of the
base (<checkpoint_dir>/base_model) that the adapter's base_model_name_or_path names. This script
loads that base with transformers, the adapter with peft.PeftModel.from_pretrained, and compares
the logits of every prompt position with dtr-generate --adapter ... --save-logits (dtr's forward
of the GGUF + adapter, Gemma chat template) on a few prompts; it prints the max |diff| and the
argmax agreement, and exits 1 above --tol.

Usage (reference venv: torch, transformers, peft):
  /work/.venv-ref/bin/python scripts/check-peft-adapter.py --gguf data/gemma3-270m-q4_k_m.gguf \\
      --adapter out/gemma3_270m_lora_perlfaq/adapter --dtr-generate build/bin/dtr-generate
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "golden"))

PROMPTS = ["How do I reverse a string in Perl?", "What does the chomp function do?",
           "How can I read a file line by line?"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--dtr-generate", required=True)
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    import numpy as np
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.chat_template_utils import render_jinja_template
    from make_chat_template_fixture import GEMMA3
    torch.set_num_threads(2)
    base_dir = json.load(open(os.path.join(a.adapter, "adapter_config.json")))["base_model_name_or_path"]
    d, f = os.path.split(os.path.abspath(a.gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, a.adapter).eval()
    worst, agree, total = 0.0, 0, 0
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for i, p in enumerate(PROMPTS):
            npy = os.path.join(tmp, f"{i}.npy")
            subprocess.run([a.dtr_generate, "--model", a.gguf, "--adapter", a.adapter, "--prompt", p,
                            "--max-new-tokens", "1", "--save-logits", npy], check=True, stdout=subprocess.DEVNULL)
            got = torch.from_numpy(np.load(npy))
            text = render_jinja_template([[{"role": "user", "content": p}]], chat_template=GEMMA3,
                                         add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>")[0][0]
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert got.shape[0] == len(ids), f"dtr saw {got.shape[0]} prompt tokens, transformers {len(ids)}"
            want = model(input_ids=torch.tensor([ids])).logits[0]
            diff = (got - want).abs().max().item()
            worst = max(worst, diff)
            agree += (got.argmax(-1) == want.argmax(-1)).sum().item()
            total += len(ids)
            print(f"prompt {i}: {len(ids)} tokens, max |dtr - PEFT| logits {diff:.3e}")
    print(f"PEFT {__import__('peft').__version__} on {base_dir}: max |logits diff| {worst:.3e} over {total} positions "
          f"x {want.shape[-1]} vocab; argmax equal at {agree}/{total}")
    return 0 if worst <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
