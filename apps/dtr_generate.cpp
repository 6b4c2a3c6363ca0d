// dtr-generate: chat with a base model (GGUF file or HF directory), optionally with a PEFT LoRA
// adapter (e.g. the one dtr-train writes), using the model's ChatML template.
//   dtr-generate --model data/smollm2-135m-instruct.gguf [--adapter out/.../adapter]
//                --prompt "How do I reverse a string in Perl?" [--max-new-tokens 64]
//                [--temperature 0 (greedy) | --temperature 0.7 --top-p 0.9] [--seed 1]
// Decoding uses the attention layers' KV cache (the prompt once, then one token per step);
// --no-kv-cache recomputes the whole sequence each step. Stops at <|im_end|> / eos.
// Errors: one line, exit 1.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "models/formats/gguf.h"
#include "models/transformer/load.h"
#include "models/lora/peft.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/tokenizer/chat_template.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/random.h"

namespace {

/// Next token from the last position's logits: argmax when temperature <= 0, else nucleus
/// (top-p) sampling from softmax(logits / temperature) with the Philox stream.
int64_t pick(const std::vector<float>& logits, double temperature, double top_p, uint64_t seed, uint64_t step) {
  if (temperature <= 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += (p[i] = std::exp((logits[i] - mx) / temperature));
  std::vector<int64_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  double mass = 0;
  size_t keep = 0;
  while (keep < order.size() && mass < top_p * z) mass += p[order[keep++]];
  const double u = dtr::philox_uniform(seed, step) * mass;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[order[i]];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

/// The tokenizer and chat template of `path`: a GGUF (tokenizer.ggml.*, tokenizer.chat_template),
/// an HF directory or a tokenizer.json (tokenizer_config.json beside it for the special tokens
/// and chat_template). ChatML when no template is given. Errors: a path that is none of these.
std::pair<dtr::tokenizer::BPETokenizer, dtr::tokenizer::ChatTemplate> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  using dtr::tokenizer::BPETokenizer;
  using dtr::tokenizer::ChatTemplate;
  if (path.size() > 5 && path.substr(path.size() - 5) == ".gguf") {
    const auto g = dtr::gguf::GGUFFile::open(path);
    return {BPETokenizer::from_gguf(g), g.has("tokenizer.chat_template")
                                            ? ChatTemplate::from_jinja(g.get("tokenizer.chat_template").as_string())
                                            : ChatTemplate::chatml()};
  }
  const fs::path json_file = fs::is_directory(path) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  DTR_CHECK(fs::exists(json_file), "--tokenizer: '", path,
            "' is neither a .gguf file nor an HF directory with tokenizer.json nor a tokenizer.json");
  BPETokenizer tok = BPETokenizer::from_hf_file(json_file.string());
  ChatTemplate tmpl = ChatTemplate::chatml();
  std::ifstream cfg_in(json_file.parent_path() / "tokenizer_config.json");
  if (cfg_in.good()) {
    const auto cfg = nlohmann::json::parse(cfg_in, nullptr, false);
    if (cfg.is_object() && cfg.contains("chat_template") && cfg["chat_template"].is_string())
      tmpl = ChatTemplate::from_jinja(cfg["chat_template"].get<std::string>());
  }
  return {std::move(tok), std::move(tmpl)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtr-generate: chat with a Llama model (+ optional PEFT LoRA adapter)"};
  std::string model_path, adapter, prompt, tokenizer_src;
  int max_new = 64;
  double temperature = 0.0, top_p = 0.9;
  uint64_t seed = 1;
  bool no_cache = false;
  app.add_option("--model", model_path, "GGUF file or HF directory")->required()->check(CLI::ExistingPath);
  app.add_option("--adapter", adapter, "PEFT adapter directory")->check(CLI::ExistingDirectory);
  app.add_option("--prompt", prompt, "the user message")->required();
  app.add_option("--tokenizer", tokenizer_src,
                 "tokenizer: a GGUF file, an HF directory (tokenizer.json + tokenizer_config.json) or a "
                 "tokenizer.json (default: --model)")
      ->check(CLI::ExistingPath);
  app.add_option("--max-new-tokens", max_new, "tokens to generate")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--temperature", temperature, "0 = greedy")->check(CLI::Range(0.0, 10.0))->capture_default_str();
  app.add_option("--top-p", top_p, "nucleus mass")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--seed", seed, "sampling seed")->capture_default_str();
  app.add_flag("--no-kv-cache", no_cache, "recompute the whole sequence at every step");
  CLI11_PARSE(app, argc, argv);
  try {
    dtr::init(argc, argv);
    dtr::NoGradGuard ng;
    const std::string tok_path = tokenizer_src.empty() ? model_path : tokenizer_src;
    const auto [tok, tmpl] = load_tokenizer(tok_path);
    auto model = dtr::load_model(model_path);
    if (!adapter.empty()) dtr::load_peft_adapter(*model, adapter);
    model->eval();
    std::vector<int32_t> ids = tok.encode(tmpl.render({{"user", prompt}}, true));
    const int32_t im_end = tok.token_to_id("<|im_end|>");
    std::vector<int32_t> out;
    if (!no_cache) dtr::enable_kv_cache(*model, true);
    for (int step = 0; step < max_new; ++step) {
      // With the cache, only the tokens not yet seen are fed (the whole prompt at step 0).
      const size_t from = (!no_cache && step > 0) ? ids.size() - 1 : 0;
      std::vector<int64_t> v(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
      dtr::Tensor x = dtr::from_vector<int64_t>(v, {1, static_cast<int64_t>(v.size())});
      dtr::Tensor logits = model->call(x);
      const int64_t V = logits.size(-1);
      std::vector<float> last = logits.narrow(1, logits.size(1) - 1, 1).reshape({V}).to_vector<float>();
      const int32_t next = static_cast<int32_t>(pick(last, temperature, top_p, seed, static_cast<uint64_t>(step)));
      if (next == im_end || next == tok.eos_id()) break;
      ids.push_back(next);
      out.push_back(next);
    }
    std::printf("%s\n", tok.decode(out).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtr-generate: error: %s\n", e.what());
    dtr::finalize();
    return 1;
  }
  dtr::finalize();
  return 0;
}
