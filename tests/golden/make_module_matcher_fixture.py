"""Reference for dtr's ModuleMatcher regex form: Python's re.fullmatch (what PEFT's
check_target_module_exists does with a string target_modules) over the debug Llama's Linear FQNs.
    python3 tests/golden/make_module_matcher_fixture.py > tests/golden/module_matcher.json
"""
import json
import re

FQNS = [f"model.layers.{l}.self_attn.{p}_proj" for l in (0, 1, 12) for p in "qkvo"]
FQNS += [f"model.layers.{l}.mlp.{p}_proj" for l in (0, 1, 12) for p in ("gate", "up", "down")]
FQNS += ["lm_head", "model.layers.0.self_attn.q_proj_extra", "xq_proj"]
PATTERNS = [
    r".*q_proj",
    r".*\.(q|v)_proj",
    r"model\.layers\.[01]\..*_proj",
    r"q_proj",
    r".*layers\.1\.mlp\..*",
    r"(model\.layers\.0\.self_attn\.q_proj|model\.layers\.1\.mlp\.down_proj)",
    r".*(?:gate|up)_proj",
    r".*\d\.self_attn\.o_proj",
    r"^.*k_proj$",
    r".*Q_PROJ",
    r"(?i).*Q_PROJ",
    r".*[^a-z]v_proj",
    r".*self_attn\..{6}",
    r".*\bmlp\b.*",
    r"lm_head",
    r".*_proj|lm_head",
    r"model\.layers\.\d{2}\..*",
    r".*(_proj)+",
    r"(.*\.)?q_proj",
    r"",
]
cases = [{"pattern": p, "fqn": f, "match": re.fullmatch(p, f) is not None} for p in PATTERNS for f in FQNS]
print('{"source": "python re.fullmatch", "cases": [')
print(",\n".join(json.dumps(c) for c in cases))
print("]}")
