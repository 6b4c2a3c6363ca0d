#!/usr/bin/env python3
"""The models' own chat templates rendered by transformers, for tests/models/test_chat_template.cpp.

tests/golden/chat_templates_real.json
    For the Jinja chat_template strings the models ship in their tokenizer_config.json
      gemma    google/gemma-3-4b-it (the Gemma 3 template; the 270M GGUF carries none)
      llama3   meta-llama/Meta-Llama-3-8B-Instruct
      mistral  mistralai/Mistral-7B-Instruct-v0.2 (user / assistant only: it raises on a system role)
    a few conversations rendered by transformers' own renderer (render_jinja_template, the code
    behind tokenizer.apply_chat_template(..., tokenize=False)) with and without the generation
    prompt, and for gemma the ids of the rendered text from transformers' tokenizer of
    data/gemma3-270m-q4_k_m.gguf (when present). dtr must recognise each template from its text
    (ChatTemplate::from_jinja) and render the same text.

Usage: /work/.venv-ref/bin/python tests/golden/make_chat_template_fixture.py
"""
import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
GEMMA_GGUF = os.path.join(os.path.dirname(os.path.dirname(HERE)), "data", "gemma3-270m-q4_k_m.gguf")

GEMMA3 = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
          "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
           "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

TEMPLATES = [
    {"kind": "gemma", "source": "google/gemma-3-4b-it tokenizer_config.json", "jinja": GEMMA3,
     "specials": {"bos_token": "<bos>", "eos_token": "<eos>"}},
    {"kind": "llama3", "source": "meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json", "jinja": LLAMA3,
     "specials": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}},
    {"kind": "mistral", "source": "mistralai/Mistral-7B-Instruct-v0.2 tokenizer_config.json", "jinja": MISTRAL,
     "specials": {"bos_token": "<s>", "eos_token": "</s>"}},
]

U = {"role": "user", "content": "How do I reverse a string in Perl?"}
A = {"role": "assistant", "content": "  Use reverse in scalar context:\n\n    my $r = reverse $s;\n"}
U2 = {"role": "user", "content": "\tAnd a list?  "}
S = {"role": "system", "content": "You are a terse Perl expert."}
CONVERSATIONS = [([U], True), ([U, A], False), ([U, A, U2], True), ([S, U, A], False), ([S, U, A, U2], True)]


def main():
    tok = None
    if os.path.exists(GEMMA_GGUF):
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(os.path.dirname(GEMMA_GGUF), gguf_file=os.path.basename(GEMMA_GGUF))
    out = {"generator": "tests/golden/make_chat_template_fixture.py",
           "reference": f"transformers {__import__('transformers').__version__} render_jinja_template", "templates": []}
    for t in TEMPLATES:
        cases = []
        for msgs, agp in CONVERSATIONS:
            if t["kind"] == "mistral" and msgs[0]["role"] == "system":
                continue  # the v0.2 template raises on a system message
            text = render_jinja_template([msgs], chat_template=t["jinja"], add_generation_prompt=agp,
                                         **t["specials"])[0][0]
            case = {"messages": msgs, "add_generation_prompt": agp, "text": text}
            if t["kind"] == "gemma" and tok is not None:
                case["ids"] = tok(text, add_special_tokens=False)["input_ids"]
            cases.append(case)
        out["templates"].append({"kind": t["kind"], "source": t["source"], "jinja": t["jinja"], "cases": cases})
    dst = os.path.join(HERE, "chat_templates_real.json")
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote", dst, sum(len(t["cases"]) for t in out["templates"]), "cases")


if __name__ == "__main__":
    main()
