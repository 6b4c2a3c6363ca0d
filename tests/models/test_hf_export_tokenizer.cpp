// The tokenizer files dtr-convert gguf-to-hf writes tokenise in transformers as dtr does:
// tests/golden/hf_export_tokenizer_ids.json holds AutoTokenizer's ids on an exported SmolLM2
// (tests/golden/make_hf_export_tokenizer_fixture.py), compared here with dtr's tokenizer read
// from the GGUF. With tokenizer_class GPT2Tokenizer transformers ignored tokenizer.json's
// pre-tokenizer and "x² ½" came out differently (see the script).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "models/formats/gguf.h"
#include "models/tokenizer/bpe_tokenizer.h"

using namespace dtr;
using namespace dtr::tokenizer;

TEST_CASE("tokenizer_config.json names a class that runs tokenizer.json", "[tokenizer][hf]") {
  const char* model = "data/smollm2-135m-instruct.gguf";
  std::ifstream in("tests/golden/hf_export_tokenizer_ids.json");
  REQUIRE(in.good());
  const nlohmann::json fx = nlohmann::json::parse(in);
  if (!std::filesystem::exists(model)) {
    WARN("SKIP: " << model << " is absent (run scripts/fetch-model.sh)");
    return;
  }
  const BPETokenizer tok = BPETokenizer::from_gguf(gguf::GGUFFile::open(model));
  CHECK(to_hf_tokenizer_config(tok, "", 8192)["tokenizer_class"] == "PreTrainedTokenizerFast");
  for (size_t i = 0; i < fx["texts"].size(); ++i) {
    const std::string text = fx["texts"][i].get<std::string>();
    const std::vector<int32_t> want = fx["ids"][i].get<std::vector<int32_t>>();
    INFO("text: " << text);
    CHECK(tok.encode(text) == want);
  }
}
