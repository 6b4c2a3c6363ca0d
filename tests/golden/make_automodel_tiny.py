"""Writes tests/golden/automodel_tiny/: a tiny random Llama in Hugging Face format (config.json,
model.safetensors) with a byte-level BPE tokenizer (tokenizer.json: the 256 byte tokens, no
merges, and <|endoftext|> <|im_start|> <|im_end|> <pad>; tokenizer_config.json with a ChatML chat
template), the "local model" the Automodel recipes in tests/automodel/ point at.
Run with /work/.venv-ref/bin/python tests/golden/make_automodel_tiny.py (transformers, tokenizers)."""
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "automodel_tiny")
os.makedirs(out, exist_ok=True)

byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins of GPT-2's bytes_to_unicode
vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: ord(c)))}
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer = byte_level
tok.decoder = decoders.ByteLevel()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
tok.add_special_tokens(specials)
tok.save(os.path.join(out, "tokenizer.json"))
chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<pad>", "unk_token": None, "add_bos_token": False, "chat_template": chatml,
               "model_max_length": 512}, f, indent=1)

torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
                  eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=tok.token_to_id("<pad>"))
model = LlamaForCausalLM(cfg).to(torch.float32)
model.save_pretrained(out, safe_serialization=True)
print("wrote", out, "vocab", cfg.vocab_size)
