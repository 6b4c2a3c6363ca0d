#!/usr/bin/env python3
"""dtr-generate's reference on the real Gemma 3 270M GGUF (data/gemma3-270m-q4_k_m.gguf).

tests/golden/gemma3_270m_generate.json
    For a few user prompts: the prompt rendered with Gemma 3's own chat template (google/gemma-3-4b-it's,
    from make_chat_template_fixture.py; the GGUF carries none) and add_generation_prompt, its ids from
    transformers' tokenizer of the GGUF, and transformers' greedy generation (f32, eager attention,
    do_sample=False) of up to MAX_NEW tokens, stopping at <end_of_turn> or <eos>, as ids and text.
    tests/apps/generate_gemma3.sh runs dtr-generate --print-ids on the same prompts and compares.

Usage: /work/.venv-ref/bin/python tests/golden/make_gemma3_generate_fixture.py
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
GEMMA = os.path.join(os.path.dirname(os.path.dirname(HERE)), "data", "gemma3-270m-q4_k_m.gguf")
PROMPTS = ["How do I reverse a string in Perl?", "What is the capital of France?"]
MAX_NEW = 24


def main():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.chat_template_utils import render_jinja_template
    from make_chat_template_fixture import GEMMA3
    if not os.path.exists(GEMMA):
        sys.exit(f"no {GEMMA}: run scripts/fetch-model.sh gemma3")
    torch.set_num_threads(2)
    d, f = os.path.split(GEMMA)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager").eval()
    stop = [tok.convert_tokens_to_ids("<end_of_turn>"), tok.eos_token_id]
    out = {"generator": "tests/golden/make_gemma3_generate_fixture.py", "gguf": f, "max_new_tokens": MAX_NEW,
           "tool": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}", "cases": []}
    with torch.no_grad():
        for p in PROMPTS:
            text = render_jinja_template([[{"role": "user", "content": p}]], chat_template=GEMMA3,
                                         add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>")[0][0]
            ids = tok(text, add_special_tokens=False)["input_ids"]
            gen = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=stop)
            new = gen[0, len(ids):].tolist()
            if new and new[-1] in stop:
                new = new[:-1]  # dtr-generate prints up to the stop token, not including it
            out["cases"].append({"prompt": p, "prompt_ids": ids, "output_ids": new, "text": tok.decode(new)})
            print(repr(p), "->", repr(tok.decode(new)))
    with open(os.path.join(HERE, "gemma3_270m_generate.json"), "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1, ensure_ascii=False)
        fh.write("\n")


if __name__ == "__main__":
    main()
