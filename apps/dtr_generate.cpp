// dtr-generate: chat with a base model (GGUF file or HF directory), optionally with a PEFT LoRA
// adapter (e.g. the one dtr-train writes), in the model's chat template.
//   dtr-generate --model data/smollm2-135m-instruct.gguf [--adapter out/.../adapter]
//                --prompt "How do I reverse a string in Perl?" [--max-new-tokens 64]
//                [--temperature 0 (greedy) | --temperature 0.7 --top-p 0.9] [--seed 1]
// Decoding uses the attention layers' KV cache (the prompt once, then one token per step);
// --no-kv-cache recomputes the whole sequence each step. The tokenizer follows the file
// (tokenizer::load_tokenizer: GGUF tokenizer.ggml.model gpt2 -> byte-level BPE, llama ->
// SentencePiece; HF tokenizer.json); the chat template is --chat-template, else the file's own
// (recognised from its Jinja text), else gemma for Gemma models (their GGUF has none), else ChatML.
// Stops at the template's end-of-turn token (<|im_end|>, <end_of_turn>, <|eot_id|>, </s>) or eos.
// Errors: one line, exit 1.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>

#include "models/formats/gguf.h"
#include "models/transformer/load.h"
#include "models/lora/peft.h"
#include "models/tokenizer/tokenizer.h"
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

/// The chat template `path` carries: a GGUF's tokenizer.chat_template, or the chat_template of the
/// tokenizer_config.json beside an HF tokenizer.json (recognised by ChatTemplate::from_jinja).
/// Empty when the file has none.
std::optional<dtr::tokenizer::ChatTemplate> file_chat_template(const std::string& path) {
  namespace fs = std::filesystem;
  using dtr::tokenizer::ChatTemplate;
  if (path.size() > 5 && path.substr(path.size() - 5) == ".gguf") {
    const auto g = dtr::gguf::GGUFFile::open(path);
    if (g.has("tokenizer.chat_template")) return ChatTemplate::from_jinja(g.get("tokenizer.chat_template").as_string());
    return std::nullopt;
  }
  const fs::path json_file = fs::is_directory(path) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  std::ifstream cfg_in(json_file.parent_path() / "tokenizer_config.json");
  if (!cfg_in.good()) return std::nullopt;
  const auto cfg = nlohmann::json::parse(cfg_in, nullptr, false);
  if (cfg.is_object() && cfg.contains("chat_template") && cfg["chat_template"].is_string())
    return ChatTemplate::from_jinja(cfg["chat_template"].get<std::string>());
  return std::nullopt;
}

/// The template to use: --chat-template NAME, else the tokenizer file's own, else the family's
/// only template (Gemma: its GGUF carries none), else ChatML.
dtr::tokenizer::ChatTemplate choose_chat_template(const std::string& name, const std::string& tok_path,
                                                  const std::string& model_type) {
  using dtr::tokenizer::ChatTemplate;
  if (!name.empty()) return ChatTemplate::from_name(name);
  if (auto t = file_chat_template(tok_path)) return *t;
  if (model_type.rfind("gemma", 0) == 0) return ChatTemplate::from_name("gemma");
  return ChatTemplate::chatml();
}

/// Writes the 2-D f32 tensor `t` as a NumPy .npy file (format 1.0, little-endian, C order).
void write_npy_f32(const std::string& path, const dtr::Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector<float>();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(t.size(0)) + ", " +
                       std::to_string(t.size(1)) + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  DTR_CHECK(f.good(), "--save-logits: cannot write '", path, "'");
  const uint16_t n = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&n), 2);
  f << header;
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  DTR_CHECK(f.good(), "--save-logits: writing '", path, "' failed");
}

/// The token that closes an assistant turn in `t` (generation stops there, as at eos).
std::string end_of_turn(const dtr::tokenizer::ChatTemplate& t) {
  if (t.kind() == "gemma") return "<end_of_turn>";
  if (t.kind() == "llama3") return "<|eot_id|>";
  if (t.kind() == "mistral") return "</s>";
  return dtr::tokenizer::ChatTemplate::kEnd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtr-generate: chat with a model (+ optional PEFT LoRA adapter)"};
  std::string model_path, adapter, prompt, tokenizer_src, chat_template, save_logits;
  int max_new = 64;
  double temperature = 0.0, top_p = 0.9;
  uint64_t seed = 1;
  bool no_cache = false, print_ids = false;
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
  app.add_option("--chat-template", chat_template,
                 "chat template by name (default: the tokenizer file's own template, recognised from its text; "
                 "else gemma for Gemma models, else chatml)")
      ->check(CLI::IsMember({"chatml", "smollm2", "gemma", "llama3", "mistral"}));
  app.add_option("--save-logits", save_logits,
                 "write the prompt's logits [prompt tokens, vocab] (f32, .npy) to this file, e.g. to compare with "
                 "transformers / PEFT");
  app.add_flag("--print-ids", print_ids, "print the generated token ids (space separated) instead of the text");
  CLI11_PARSE(app, argc, argv);
  try {
    dtr::init(argc, argv);
    dtr::NoGradGuard ng;
    const std::string tok_path = tokenizer_src.empty() ? model_path : tokenizer_src;
    const auto tok = dtr::tokenizer::load_tokenizer(tok_path);
    auto model = dtr::load_model(model_path);
    if (!adapter.empty()) dtr::load_peft_adapter(*model, adapter);
    model->eval();
    const auto tmpl = choose_chat_template(chat_template, tok_path, model->config().model_type);
    std::vector<int32_t> ids = tok->encode(tmpl.render({{"user", prompt}}, true));
    const int32_t stop = tok->token_to_id(end_of_turn(tmpl));
    std::vector<int32_t> out;
    if (!no_cache) dtr::enable_kv_cache(*model, true);
    for (int step = 0; step < max_new; ++step) {
      // With the cache, only the tokens not yet seen are fed (the whole prompt at step 0).
      const size_t from = (!no_cache && step > 0) ? ids.size() - 1 : 0;
      std::vector<int64_t> v(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
      dtr::Tensor x = dtr::from_vector<int64_t>(v, {1, static_cast<int64_t>(v.size())});
      dtr::Tensor logits = model->call(x);
      const int64_t V = logits.size(-1);
      if (step == 0 && !save_logits.empty()) write_npy_f32(save_logits, logits.reshape({logits.size(1), V}));
      std::vector<float> last = logits.narrow(1, logits.size(1) - 1, 1).reshape({V}).to_vector<float>();
      const int32_t next = static_cast<int32_t>(pick(last, temperature, top_p, seed, static_cast<uint64_t>(step)));
      if (next == stop || next == tok->eos_id()) break;
      ids.push_back(next);
      out.push_back(next);
    }
    if (print_ids) {
      std::string line;
      for (int32_t t : out) line += (line.empty() ? "" : " ") + std::to_string(t);
      std::printf("%s\n", line.c_str());
    } else {
      std::printf("%s\n", tok->decode(out).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtr-generate: error: %s\n", e.what());
    dtr::finalize();
    return 1;
  }
  dtr::finalize();
  return 0;
}
