// Tokenizers of the real models against Hugging Face on a corpus of 224 strings (code, unicode,
// emoji, whitespace runs, numbers, special-token text, markup; tests/golden/tokenizer_corpus.json
// from tests/golden/make_gemma3_fixture.py): the Gemma 3 270M GGUF (SentencePiece-style BPE with
// byte fallback, reference transformers' GGUF tokenizer) and SmolLM2 (byte-level BPE); ids equal,
// decode(encode(s)) == s, bos added when asked. Skip when a model file is absent.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/tokenizer/sentencepiece.h"
#include "models/tokenizer/tokenizer.h"

using namespace dtr;

namespace {

nlohmann::json corpus() {
  std::ifstream in("tests/golden/tokenizer_corpus.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

void check_corpus(const tokenizer::Tokenizer& tok, const nlohmann::json& j, const nlohmann::json& ref) {
  const auto& texts = j["texts"];
  REQUIRE(texts.size() >= 200);
  REQUIRE(ref["ids"].size() == texts.size());
  int equal = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string s = texts[i].get<std::string>();
    INFO("string " << i << ": '" << s << "'");
    const auto ids = tok.encode(s);
    const auto want = ref["ids"][i].get<std::vector<int32_t>>();
    CHECK(ids == want);
    equal += ids == want;
    CHECK(tok.decode(ids) == s);
    tokenizer::Tokenizer::Offsets off;
    CHECK(tok.encode_with_offsets(s, off) == ids);
    REQUIRE(off.size() == ids.size());
    size_t pos = 0;  // the ranges tile the text
    for (const auto& [b, e] : off) {
      CHECK(b == pos);
      pos = e;
    }
    CHECK(pos == s.size());
  }
  WARN(equal << " of " << texts.size() << " strings tokenised as Hugging Face does");
}

}  // namespace

TEST_CASE("Gemma 3 GGUF tokenizer equals transformers' on the corpus", "[tokenizer][gemma3]") {
  const char* path = "data/gemma3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) {
    WARN("SKIP: " << path << " not found (run scripts/fetch-model.sh gemma3)");
    return;
  }
  const auto j = corpus();
  auto tok = tokenizer::load_tokenizer(path);
  REQUIRE(dynamic_cast<const tokenizer::SentencePieceTokenizer*>(tok.get()) != nullptr);
  CHECK(tok->vocab_size() == 262144);
  CHECK(tok->bos_id() == 2);
  CHECK(tok->eos_id() == 1);
  check_corpus(*tok, j, j["gemma3"]);
  CHECK(tok->encode("Hello", /*add_special=*/true) == j["gemma3"]["bos_ids"].get<std::vector<int32_t>>());
  CHECK(tok->token_to_id("<start_of_turn>") == 105);
  CHECK(tok->is_special(106));
}

TEST_CASE("SmolLM2 GGUF tokenizer equals Hugging Face's on the corpus", "[tokenizer]") {
  const char* path = "data/smollm2-135m-instruct.gguf";
  const auto j = corpus();
  if (!std::filesystem::exists(path) || !j.contains("smollm2")) {
    WARN("SKIP: " << path << " not found (run scripts/fetch-model.sh)");
    return;
  }
  auto tok = tokenizer::load_tokenizer(path);
  check_corpus(*tok, j, j["smollm2"]);
}

TEST_CASE("SentencePiece merges from a vocabulary follow transformers' generate_merges", "[tokenizer]") {
  // Tokens in file order a, b, c, ab, bc, abc: "abc" splits as (a, bc) and (ab, c); ranks follow
  // the priority (file position), then longer left parts first.
  const std::vector<std::string> t{"a", "b", "c", "ab", "bc", "abc"};
  const std::vector<double> prio{0, -1, -2, -3, -4, -5};
  const auto m = tokenizer::merges_from_vocab(t, prio);
  using P = std::pair<std::string, std::string>;
  CHECK(m == std::vector<P>{{"a", "b"}, {"b", "c"}, {"ab", "c"}, {"a", "bc"}});
  tokenizer::SentencePieceVocab v;
  v.tokens = {"<unk>", "<0x41>", "a", "b", "c", "ab", "bc", "abc", "\xe2\x96\x81", "\xe2\x96\x81" "a"};
  v.types = {tokenizer::TokenType::unknown, tokenizer::TokenType::byte, tokenizer::TokenType::normal,
             tokenizer::TokenType::normal, tokenizer::TokenType::normal, tokenizer::TokenType::normal,
             tokenizer::TokenType::normal, tokenizer::TokenType::normal, tokenizer::TokenType::normal,
             tokenizer::TokenType::normal};
  v.unk_id = 0;
  v.merges = tokenizer::merges_from_vocab(v.tokens, {0, -1, -2, -3, -4, -5, -6, -7, -8, -9});
  tokenizer::SentencePieceTokenizer tok(v);
  CHECK(tok.encode("abc a") == std::vector<int32_t>{7, 9});  // " " -> U+2581, merged with "a"
  CHECK(tok.encode("A") == std::vector<int32_t>{1});         // byte fallback <0x41>
  CHECK(tok.encode("Z") == std::vector<int32_t>{0});         // no byte token: <unk>
  CHECK(tok.decode({7, 9, 1}) == "abc aA");
}
