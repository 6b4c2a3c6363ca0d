#!/usr/bin/env python3
"""Generates tests/golden/tokenizer_ids.json: reference token ids of SmolLM2-135M-Instruct.

Reference = Hugging Face `tokenizers` (the Rust library behind transformers' fast tokenizers)
built from the GGUF's own vocabulary, merges and token types, with SmolLM2's pre-tokenizer:
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]
(the pre_tokenizer of HuggingFaceTB/SmolLM2-*'s tokenizer.json; llama.cpp calls it "smollm").
transformers' own GGUF tokenizer path is not used directly: for pre-type "smollm" it falls
back to plain GPT-2 splitting (no digit split), which is not what the released tokenizer does,
and its GGUF loader needs torch. Special (control) tokens are added as special AddedTokens, so
they are split out before BPE exactly as in the released tokenizer. The chat conversation is
rendered with the GGUF's own Jinja chat template (jinja2).

Usage (venv under /tmp; python libs are only used to make this fixture):
  python3 -m venv /tmp/dtr-fixture-venv && /tmp/dtr-fixture-venv/bin/pip install tokenizers gguf jinja2
  /tmp/dtr-fixture-venv/bin/python tests/golden/make_tokenizer_fixture.py data/smollm2-135m-instruct.gguf
"""
import json
import os
import sys

import gguf
import jinja2
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

STRINGS = [
    ("ascii", "Hello, world! This is a simple sentence."),
    ("contractions", "I'm sure they'll say it's fine, we've done it, you'd agree."),
    ("accents", "Café déjà vu, naïve coöperation, Ångström, Straße, señor."),
    ("cjk", "日本語のテキストと中文文本，한국어 텍스트."),
    ("emoji", "Emoji: 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵"),
    ("code", "def f(x):\n    return x**2 + 1  # square\n\nfor i in range(10):\n\tprint(f(i))\n"),
    ("perl", 'my %h = (a => 1); print "$_\\n" for sort keys %h; s/\\s+$//;'),
    ("numbers", "In 2024, 3.14159 * 1000000 = 3141590; phone +1-800-555-0199; 1,234,567.89"),
    ("whitespace", "a  b   c    d\n\n\n  e\t\tf \n \r\n   "),
    ("leading_spaces", "   leading and trailing   "),
    ("specials_inline", "text <|im_start|>user\nhi<|im_end|> more <|endoftext|>"),
    ("mixed", "The naïve café served 3 crêpes 🥞 at 12:30 — «très bien»!"),
    ("unicode_spaces", "a\u0085b x\u00a0y p\u2028q full\u3000width v\u000bw \u200bzero a\u1680b"),
    ("unicode_digits", "\u0663\u0664 arabic digits \u0665, \u216b roman \u00bd \u00b2"),
    ("combining", "e\u0301 \u01c5 titlecase a'S b'LL x\r\n\r\ny"),
    ("empty", ""),
]

CHAT = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Japan? Answer in 3 words."},
]


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_ints(reader, key):
    f = reader.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


def field_scalar(reader, key):
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    return bytes(v).decode("utf-8") if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()


def smollm2_tokenizer(r):
    """HF tokenizers' Tokenizer of a SmolLM2 GGUF (reader `r`), built as described above."""
    assert field_scalar(r, "tokenizer.ggml.model") == "gpt2"
    assert field_scalar(r, "tokenizer.ggml.pre") == "smollm"
    tokens = field_strings(r, "tokenizer.ggml.tokens")
    types = field_ints(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field_strings(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == 3])
    return tok, len(tokens)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "data/smollm2-135m-instruct.gguf"
    r = gguf.GGUFReader(path)
    tok, vocab_size = smollm2_tokenizer(r)

    chat_template = field_scalar(r, "tokenizer.chat_template")
    env = jinja2.Environment()
    chat_text = env.from_string(chat_template).render(messages=CHAT, add_generation_prompt=True)

    cases = []
    for name, text in STRINGS + [("chatml", chat_text)]:
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({"name": name, "text": text, "ids": ids,
                      "decoded": tok.decode(ids, skip_special_tokens=False)})
    out = {
        "source": os.path.basename(path),
        "generator": "tests/golden/make_tokenizer_fixture.py (HF tokenizers %s)" % __import__("tokenizers").__version__,
        "bos_token_id": int(field_scalar(r, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field_scalar(r, "tokenizer.ggml.eos_token_id")),
        "vocab_size": vocab_size,
        "chat": {"messages": CHAT, "add_generation_prompt": True, "rendered": chat_text},
        "cases": cases,
    }
    dst = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_ids.json")
    # One case per line keeps the file small and diffs readable.
    cases_json = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in out.pop("cases"))
    head = json.dumps(out, ensure_ascii=False)[:-1]
    with open(dst, "w", encoding="utf-8") as f:
        f.write(head + ',\n "cases": [\n  ' + cases_json + "\n ]\n}\n")
    print(f"wrote {dst}: {len(cases)} cases")


if __name__ == "__main__":
    main()
