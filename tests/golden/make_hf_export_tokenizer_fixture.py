"""Ids that transformers gives with the tokenizer files dtr-convert gguf-to-hf writes.
  build/bin/dtr-convert gguf-to-hf data/smollm2-135m-instruct.gguf /tmp/smollm2-hf
  /work/.venv-ref/bin/python tests/golden/make_hf_export_tokenizer_fixture.py /tmp/smollm2-hf
writes tests/golden/hf_export_tokenizer_ids.json; models_test_hf_export_tokenizer checks that dtr's
tokenizer (from the GGUF) gives the same ids, so a model exported by dtr tokenises the same in
transformers (AutoTokenizer reads tokenizer_config.json's tokenizer_class: with GPT2Tokenizer
"x² ½" came out [104, 19133, 3351, 138, ...] instead of tokenizer.json's [104, 19133, 216, 16738, ...])."""
import json
import os
import sys

from transformers import AutoTokenizer

export = sys.argv[1]
tok = AutoTokenizer.from_pretrained(export)
texts = ["x² ½", "x² ½ 12345 hello", "Price: 1,234.50 €", "naïve café — ok?", "def f(x):\n    return x**2\n",
         "<|im_start|>user\nHi 42<|im_end|>\n"]
out = {"tokenizer_class": type(tok).__name__, "texts": texts,
       "ids": [tok(t, add_special_tokens=False)["input_ids"] for t in texts]}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_export_tokenizer_ids.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1, ensure_ascii=False)
print("wrote", path, out["tokenizer_class"])
