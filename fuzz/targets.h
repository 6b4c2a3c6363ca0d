#pragma once
// The parser entry points driven by the libFuzzer targets (fuzz_<name>, DTR_FUZZ=ON) and by the
// corpus regression test (tests/models/test_fuzz_corpus.cpp), so both run exactly the same code.
// Targets: safetensors, gguf, hf_config, tokenizer_json, chat_jsonl, token_shard.
// Contract of every parser on any input: load, or throw dtr::Error. Anything else (another
// exception type, a crash, a sanitizer report, a hang) is a bug. Some targets also check an
// invariant of what loaded (e.g. config.json -> LlamaConfig -> config.json is a fixed point);
// a violated invariant throws std::logic_error, which is not a dtr::Error and so a failure.
#include <string>
#include <string_view>
#include <vector>

namespace dtr::fuzz {

/// The names of the targets, in a fixed order.
const std::vector<std::string>& target_names();

/// Runs target `name` on `input` (written to a per-process scratch file first where the parser
/// takes a path). Returns true when the input loaded, false when the parser threw dtr::Error;
/// any other exception propagates. Errors: an unknown name -> std::invalid_argument.
bool run_target(const std::string& name, std::string_view input);

/// Valid inputs of target `name` built with dtr's writers: the seeds of a new corpus.
std::vector<std::string> seed_inputs(const std::string& name);

}  // namespace dtr::fuzz
