// dtr-convert's conversions: GGUF -> HF directory reloads to the same logits and token ids;
// base + PEFT adapter -> merged HF directory gives the logits of base + adapter.
#include <catch2/catch.hpp>

#include <filesystem>

#include "gradcheck.h"
#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/transformer/convert.h"
#include "models/transformer/load.h"
#include "models/lora/inject.h"
#include "models/lora/peft.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/random.h"

using namespace dtr;
namespace fs = std::filesystem;

TEST_CASE("merge-adapter: merged HF directory equals base + adapter", "[convert]") {
  const fs::path tmp = fs::temp_directory_path() / ("dtr_convert_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  manual_seed(5);
  auto base = std::make_shared<LlamaForCausalLM>(llama_debug_config());
  save_model_hf(*base, (tmp / "base").string());
  LoraConfig lc;
  lc.options.r = 4;
  apply_lora(*base, lc);
  {
    NoGradGuard ng;
    for (auto& [fqn, p] : base->named_parameters())
      if (fqn.find("lora_B") != std::string::npos) p.copy_(uniform(p.sizes(), -0.1, 0.1));
  }
  save_peft_adapter(*base, (tmp / "adapter").string());
  Tensor ids = reshape(arange(0, 16, 1, TensorOptions(DType::i64)), {2, 8});
  base->eval();
  Tensor want = base->call(ids);
  merge_adapter_to_hf((tmp / "base").string(), (tmp / "adapter").string(), (tmp / "merged").string());
  auto merged = load_model_hf((tmp / "merged").string());
  merged->eval();
  CHECK(dtr::testing::max_abs_diff(merged->call(ids), want) < 1e-5);
  fs::remove_all(tmp);
}

TEST_CASE("gguf-to-hf: the HF directory reloads to the same model and tokenizer", "[convert][real]") {
  const std::string path = "data/smollm2-135m-instruct.gguf";
  if (!fs::exists(path)) {
    WARN("SKIP: " << path << " is absent (run scripts/fetch-model.sh)");
    return;
  }
  const fs::path out = fs::temp_directory_path() / ("dtr_gguf_hf_" + std::to_string(::getpid()));
  fs::remove_all(out);
  convert_gguf_to_hf(path, out.string());
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    CHECK(fs::exists(out / f));
  auto a = load_model_gguf(path);
  auto b = load_model_hf(out.string());
  const auto tok_a = tokenizer::BPETokenizer::from_gguf(gguf::GGUFFile::open(path));
  const auto tok_b = tokenizer::BPETokenizer::from_hf_file((out / "tokenizer.json").string());
  const std::string text = "What is Perl's motto? There's more than one way to do it.";
  const auto ids_a = tok_a.encode(text);
  CHECK(ids_a == tok_b.encode(text));
  std::vector<int64_t> v(ids_a.begin(), ids_a.end());
  Tensor ids = from_vector<int64_t>(v, {1, static_cast<int64_t>(v.size())});
  NoGradGuard ng;
  CHECK(dtr::testing::max_abs_diff(a->call(ids), b->call(ids)) == 0);
  fs::remove_all(out);
}

TEST_CASE("save_base_tokenizer: a SentencePiece GGUF (Gemma's) writes no tokenizer files instead of failing",
          "[convert]") {
  // dtr-train's PEFT export of a Gemma GGUF base failed here after training (BPETokenizer::from_gguf
  // on tokenizer.ggml.model 'llama': "only byte-level BPE" error, job aborted).
  const fs::path tmp = fs::temp_directory_path() / ("dtr_convert_sp_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  gguf::GGUFWriter w;
  w.add_string("general.architecture", "gemma3");
  w.add_string("tokenizer.ggml.model", "llama");
  w.add("tokenizer.ggml.tokens", gguf::make_string_array({"<pad>", "<eos>", "<bos>", "\xe2\x96\x81a"}));
  w.add("tokenizer.ggml.scores", gguf::make_f32_array({0, 0, 0, -1}));
  w.write((tmp / "sp.gguf").string());
  const TokenizerFiles sp = save_base_tokenizer((tmp / "sp.gguf").string(), (tmp / "out").string());
  CHECK_FALSE(sp.written);
  CHECK(sp.missing.rfind("SentencePiece vocabulary (tokenizer.ggml.model 'llama')", 0) == 0);
  CHECK_FALSE(fs::exists(tmp / "out" / "tokenizer.json"));
  fs::remove_all(tmp);
}

TEST_CASE("gguf-to-hf: a GGUF without a tokenizer writes the model and says the tokenizer is missing", "[convert]") {
  // Before: "no tokenizer files: SentencePiece vocabulary" for any GGUF without a byte-level BPE
  // tokenizer, one with no tokenizer at all included.
  const fs::path tmp = fs::temp_directory_path() / ("dtr_convert_notok_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  const TokenizerFiles t = convert_gguf_to_hf("tests/golden/qwen3_moe_gguf/qwen3_moe_debug.gguf", tmp.string());
  CHECK_FALSE(t.written);
  CHECK(t.missing == "the GGUF holds no tokenizer (no tokenizer.ggml.tokens)");
  CHECK(fs::exists(tmp / "config.json"));
  CHECK(fs::exists(tmp / "model.safetensors"));
  CHECK_FALSE(fs::exists(tmp / "tokenizer.json"));
  // A tokenizer of another kind is named by its tokenizer.ggml.model.
  gguf::GGUFWriter w;
  w.add_string("tokenizer.ggml.model", "bert");
  w.add("tokenizer.ggml.tokens", gguf::make_string_array({"[PAD]", "a"}));
  w.write((tmp / "wp.gguf").string());
  CHECK(save_base_tokenizer((tmp / "wp.gguf").string(), (tmp / "wp").string()).missing ==
        "tokenizer.ggml.model 'bert': dtr writes tokenizer.json for byte-level BPE ('gpt2') only");
  fs::remove_all(tmp);
}
