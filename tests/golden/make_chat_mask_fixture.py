#!/usr/bin/env python3
"""Generates tests/golden/chat_mask.json: token ids and assistant loss masks of SmolLM2 chats.

Reference = transformers' apply_chat_template(tokenize=True, return_dict=True,
return_assistant_tokens_mask=True) on a transformers tokenizer wrapping the HF `tokenizers`
Tokenizer that make_tokenizer_fixture.py builds from the GGUF (same vocab, merges, specials and
SmolLM2 pre-tokenizer). The conversation is tokenised once as a whole, as at inference;
transformers marks a token as an assistant token when its character offsets overlap a
{% generation %} span. SmolLM2's own template has no generation markers, so the GGUF's template
is used with the assistant content + '<|im_end|>' wrapped in {% generation %} (the part dtr
trains on); the script checks that this renders exactly what the GGUF's template renders.

Each case also records `per_segment_differs`: whether tokenising the template's pieces one by
one (role header, content, <|im_end|>, newline; what dtr did before) gives other ids than the
whole rendered conversation. Replies starting with whitespace do: "\\n" + " " merge into one
token ("ĊĠ") that straddles the end of the role header and the start of the reply.

Usage (the reference venv; python libs are only used to make this fixture):
  /work/.venv-ref/bin/pip install tokenizers gguf jinja2 transformers
  /work/.venv-ref/bin/python tests/golden/make_chat_mask_fixture.py data/smollm2-135m-instruct.gguf
"""
import json
import os
import sys

import gguf
import jinja2
import tokenizers
import transformers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixture import field_scalar, smollm2_tokenizer  # noqa: E402

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# The GGUF template with the trained part of each assistant turn inside {% generation %}.
GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}{% endif %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


CASES = [
    ("space_digit", [u("Which is smaller, 7 or 9?"), a(" 7 is smaller.")]),
    ("two_spaces", [u("Say two words."), a("  two words")]),
    ("newlines", [u("Capital of France?"), a("\n\nParis.")]),
    ("newline_space_list", [u("List two."), a("\n 1. first\n 2. second")]),
    ("tab", [u("Indent it."), a("\tindented")]),
    ("plain", [u("What is the capital of France?"), a("The capital of France is Paris.")]),
    ("trailing_whitespace", [u("ok?"), a("ok  \n")]),
    ("unicode", [u("Say café."), a(" café ☕ 日本語")]),
    ("empty_reply", [u("Say nothing."), a("")]),
    ("multi_turn_system", [{"role": "system", "content": "Answer briefly."}, u("2+2?"), a(" 4"),
                           u("And 3+3?"), a("\n6"), u("Thanks"), a("  You're welcome!")]),
    ("multi_turn_default_system", [u("Hi"), a(" Hello!"), u(" How are you?"), a("\n\n Fine, thanks.")]),
]


def segments(messages):
    """The template's pieces in order: (text, trained), as dtr's ChatTemplate::render_segments."""
    out = []
    if messages[0]["role"] != "system":
        out.append(("<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n", False))
    for m in messages:
        out.append(("<|im_start|>" + m["role"] + "\n", False))
        out.append((m["content"] + "<|im_end|>", m["role"] == "assistant"))
        out.append(("\n", False))
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "data/smollm2-135m-instruct.gguf"
    r = gguf.GGUFReader(path)
    tok, _ = smollm2_tokenizer(r)
    gguf_template = jinja2.Environment().from_string(field_scalar(r, "tokenizer.chat_template"))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.chat_template = GENERATION_TEMPLATE

    cases = []
    for name, messages in CASES:
        rendered = gguf_template.render(messages=messages, add_generation_prompt=False)
        assert hf.apply_chat_template(messages, tokenize=False) == rendered, name
        assert "".join(t for t, _ in segments(messages)) == rendered, name
        out = hf.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        mask = list(out["assistant_masks"])
        assert ids == tok.encode(rendered, add_special_tokens=False).ids, name
        per_segment = []
        for text, _ in segments(messages):
            per_segment += tok.encode(text, add_special_tokens=False).ids
        cases.append({"name": name, "messages": messages, "rendered": rendered, "ids": ids,
                      "assistant_masks": mask, "per_segment_differs": per_segment != ids})
    out = {
        "source": os.path.basename(path),
        "generator": "tests/golden/make_chat_mask_fixture.py (transformers %s, HF tokenizers %s)"
                     % (transformers.__version__, tokenizers.__version__),
        "rule": "apply_chat_template(return_assistant_tokens_mask=True): a token is an assistant token when its "
                "character offsets overlap a {% generation %} span (assistant content + <|im_end|>)",
    }
    dst = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_mask.json")
    cases_json = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in cases)
    head = json.dumps(out, ensure_ascii=False)[:-1]
    with open(dst, "w", encoding="utf-8") as f:
        f.write(head + ',\n "cases": [\n  ' + cases_json + "\n ]\n}\n")
    differ = [c["name"] for c in cases if c["per_segment_differs"]]
    print(f"wrote {dst}: {len(cases)} cases; per-segment ids differ in {differ}")


if __name__ == "__main__":
    main()
