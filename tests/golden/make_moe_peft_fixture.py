#!/usr/bin/env python3
"""A PEFT LoRA adapter on the tiny Qwen3-MoE (tests/golden/qwen3_moe_debug): target_modules
q_proj / o_proj and target_parameters experts.gate_up_proj / experts.down_proj (PEFT's
ParamWrapper on the grouped experts), r 2, alpha 6, every adapter weight U(-0.3, 0.3) so the
update is not zero. Writes tests/golden/qwen3_moe_debug_adapter/ (save_pretrained) and
tests/golden/qwen3_moe_adapter.json: the logits of the adapted model on moe_models.json's batch,
after PeftModel.from_pretrained reloaded the saved adapter (so the file is what PEFT loads).

Usage: /work/.venv-ref/bin/python tests/golden/make_moe_peft_fixture.py
"""
import json
import os

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    base_dir = os.path.join(HERE, "qwen3_moe_debug")
    out_dir = os.path.join(HERE, "qwen3_moe_debug_adapter")
    with open(os.path.join(HERE, "moe_models.json")) as f:
        ref = json.load(f)["qwen3_moe"]
    ids = torch.tensor(ref["ids"]).reshape(ref["shape"])
    cfg = LoraConfig(r=2, lora_alpha=6, target_modules=["q_proj", "o_proj"],
                     target_parameters=["experts.gate_up_proj", "experts.down_proj"])
    model = get_peft_model(Qwen3MoeForCausalLM.from_pretrained(base_dir), cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.rand(p.shape, generator=g) * 0.6 - 0.3)
    model.save_pretrained(out_dir)
    os.remove(os.path.join(out_dir, "README.md"))
    cfg_path = os.path.join(out_dir, "adapter_config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    saved["base_model_name_or_path"] = "tests/golden/qwen3_moe_debug"  # not this machine's path
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
    reloaded = PeftModel.from_pretrained(Qwen3MoeForCausalLM.from_pretrained(base_dir), out_dir).eval()
    with torch.no_grad():
        logits = reloaded(ids).logits
        same = model.eval()(ids).logits
    assert torch.equal(logits, same), "the reloaded adapter differs"
    with open(os.path.join(HERE, "qwen3_moe_adapter.json"), "w") as f:
        json.dump({"ids": ref["ids"], "shape": ref["shape"], "logits": logits.flatten().tolist()}, f)


if __name__ == "__main__":
    main()
