#!/usr/bin/env python3
"""Reference fixtures for the real Gemma 3 270M GGUF (data/gemma3-270m-q4_k_m.gguf, fetched by
scripts/fetch-model.sh) and for the tokenizers of it and of SmolLM2.

tests/golden/tokenizer_corpus.json
    A corpus of >= 200 strings (code, unicode, emoji, whitespace runs, numbers, special-token text,
    markup) and the token ids of
      - gemma3: transformers' tokenizer of the GGUF (AutoTokenizer.from_pretrained(gguf_file=...):
        GemmaTokenizer, BPE with byte fallback, merges rebuilt from the vocabulary in file order,
        control tokens special, user-defined tokens added), add_special_tokens=False;
      - smollm2: HF tokenizers built from the SmolLM2 GGUF as in make_tokenizer_fixture.py.
tests/golden/gemma3_270m.json
    transformers' GGUF load of the model (weights dequantised to f32 by gguf-py), f32, eager
    attention: for several prompts the top-20 logits and the logsumexp of every position, the
    loss of a fixed batch, and greedy generation of 16 tokens.

Usage (the reference venv: torch, transformers, gguf, tokenizers):
    /work/.venv-ref/bin/python tests/golden/make_gemma3_fixture.py [--tokenizer-only]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

GEMMA = os.path.join(ROOT, "data", "gemma3-270m-q4_k_m.gguf")
SMOLLM = os.path.join(ROOT, "data", "smollm2-135m-instruct.gguf")

PROMPTS = [
    "The capital of France is",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Perl is a highly capable, feature-rich programming language with over 30 years of development.",
]


def corpus():
    base = [
        "Hello, world!", "hello world", "HELLO WORLD", " leading space", "trailing space ", "  two leading",
        "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a\n\n\nb", "\n", "\n\n", " \n ", "\t",
        "    indented line", "\r\n", "x\r\ny", "line1\nline2\n", "", " ", "  ", "   ", "\u00a0nbsp", "zero\u200bwidth",
        "I'm sure they'll say it's fine.", "don't won't can't", "Café déjà vu, naïve coöperation",
        "Ångström Straße señor", "Ελληνικά κείμενα", "Русский текст здесь", "עברית", "العربية جميلة",
        "हिन्दी पाठ", "ภาษาไทย", "日本語のテキスト", "中文文本，标点。", "한국어 텍스트", "Tiếng Việt có dấu",
        "😀", "🎉👍🏽", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵 flags", "❤️ love", "emoji🙂inline", "🥞🥞🥞",
        "0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159", "-42", "+1-800-555-0199",
        "1,234,567.89", "0x1F 0b1010 0o777", "1e-6 2.5E+10", "2024-12-01", "12:30:45", "50%", "$100.00",
        "def f(x):\n    return x**2 + 1", "for (int i = 0; i < n; ++i) { a[i] = b[i] * 2; }",
        "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
        'my %h = (a => 1); print "$_\\n" for sort keys %h;', "s/\\s+$//g; $x =~ /^(\\d+)$/;",
        "SELECT * FROM users WHERE id = 42;", "<html><body><b>bold</b> <i>it</i></body></html>",
        "<table><tr><td>1</td></tr></table>", "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
        "x = [i**2 for i in range(10) if i % 2 == 0]", "fn main() { println!(\"{}\", 1 + 1); }",
        "git commit -m \"fix: bug\" && git push", "https://example.com/path?q=1&r=2#frag",
        "user@example.com", "C:\\Users\\name\\file.txt", "/usr/local/bin/python3", "~/.bashrc",
        "<start_of_turn>user\nhi<end_of_turn>\n", "<bos>text<eos>", "<pad><unk><mask>", "<unused0> <unused99>",
        "[multimodal]", "<start_of_image>", "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "<s>[INST] hi [/INST]",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>", "<not a token>", "< b >", "<<>>",
        "The quick brown fox jumps over the lazy dog.", "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
        "ThisIsCamelCase and snake_case_name and kebab-case-name", "ALLCAPS lowercase MiXeD", "a.b.c,d;e:f!g?h",
        "...", "!!!???", "---", "___", "***", "~~~", "```python\nprint(1)\n```", "> quote\n>> nested",
        "• bullet – dash — emdash … ellipsis", "“quotes” ‘single’ «guillemets»", "½ ¼ ² ³ ™ © ®",
        "\u0663\u0664 arabic digits", "\u216b roman", "e\u0301 combining", "\u01c5 titlecase",
        "ｆｕｌｌｗｉｄｔｈ", "a\u3000b ideographic space", "tab\there", "mixed \t \n whitespace",
    ]
    words = ["alpha", "Beta", "gamma42", "δέλτα", "ε", "零", "🚀", "x_y", "naïve", "end."]
    seps = [" ", "  ", "\n", "\t", "", ", ", " - ", "\n\n"]
    out = list(base)
    for i in range(len(words)):
        for j, s in enumerate(seps):
            out.append(words[i] + s + words[(i * 3 + j + 1) % len(words)])
    out += [" " * n + "x" for n in range(1, 9)] + ["x" + "\n" * n + "y" for n in range(1, 5)]
    out += [str(10 ** k + 7 * k) for k in range(12)]
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def gemma_tokenizer():
    from transformers import AutoTokenizer
    d, f = os.path.split(GEMMA)
    return AutoTokenizer.from_pretrained(d, gguf_file=f)


def make_tokenizer_corpus():
    texts = corpus()
    assert len(texts) >= 200, len(texts)
    tok = gemma_tokenizer()
    out = {"generator": "tests/golden/make_gemma3_fixture.py", "texts": texts,
           "gemma3": {"source": os.path.basename(GEMMA), "reference": f"transformers {__import__('transformers').__version__} "
                      "AutoTokenizer.from_pretrained(gguf_file=...), add_special_tokens=False",
                      "bos_ids": tok("Hello", add_special_tokens=True)["input_ids"],
                      "ids": [tok(t, add_special_tokens=False)["input_ids"] for t in texts]}}
    if os.path.exists(SMOLLM):
        import gguf
        from make_tokenizer_fixture import smollm2_tokenizer
        st, _ = smollm2_tokenizer(gguf.GGUFReader(SMOLLM))
        out["smollm2"] = {"source": os.path.basename(SMOLLM),
                          "reference": "HF tokenizers from the GGUF vocab (make_tokenizer_fixture.py)",
                          "ids": [st.encode(t, add_special_tokens=False).ids for t in texts]}
    dst = os.path.join(HERE, "tokenizer_corpus.json")
    with open(dst, "w", encoding="utf-8") as fh:
        json.dump(out, fh, ensure_ascii=False)
    print(f"wrote {dst}: {len(texts)} strings")
    return tok


def make_model_fixture(tok):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(2)
    d, f = os.path.split(GEMMA)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager").eval()
    res = {"gguf": os.path.basename(GEMMA), "tool": f"torch {torch.__version__}, transformers "
           f"{__import__('transformers').__version__}", "prompts": []}
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, add_special_tokens=True)["input_ids"]
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            top = torch.topk(logits, 20, dim=-1)
            res["prompts"].append({"text": p, "input_ids": ids, "top_ids": top.indices.tolist(),
                                   "top_logits": top.values.tolist(),
                                   "logsumexp": torch.logsumexp(logits, -1).tolist()})
        ids = tok(PROMPTS[3] + " " + PROMPTS[0], add_special_tokens=True)["input_ids"][:24]
        batch = torch.tensor([ids[:12], ids[12:24]])
        res["loss_batch"] = batch.tolist()
        res["loss"] = model(input_ids=batch, labels=batch).loss.item()
        gen_ids = tok(PROMPTS[1], add_special_tokens=True)["input_ids"]
        out = model.generate(torch.tensor([gen_ids]), max_new_tokens=16, do_sample=False)
        res["generate"] = {"input_ids": gen_ids, "output_ids": out[0, len(gen_ids):].tolist()}
    with open(os.path.join(HERE, "gemma3_270m.json"), "w") as fh:
        json.dump(res, fh)
    print("gemma3_270m: loss", res["loss"], "generated", tok.decode(res["generate"]["output_ids"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-only", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(GEMMA):
        sys.exit(f"no {GEMMA}: run scripts/fetch-model.sh gemma3")
    tok = make_tokenizer_corpus()
    if not a.tokenizer_only:
        make_model_fixture(tok)


if __name__ == "__main__":
    main()
