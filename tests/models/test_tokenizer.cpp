// Byte-level BPE tokenizer, pre-tokenizer, ChatML template; the real SmolLM2 tokenizer against
// reference ids from Hugging Face tokenizers (tests/golden/tokenizer_ids.json).
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>

#include "models/formats/gguf.h"
#include "models/formats/mapped_file.h"
#include "models/test_util.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/tokenizer/byte_level.h"
#include "models/tokenizer/chat_template.h"

using namespace dtr;
using namespace dtr::tokenizer;
using Catch::Matchers::Contains;

namespace {

const char* kModel = "data/smollm2-135m-instruct.gguf";

std::vector<std::string> pieces(const PreTokenizer& p, const std::string& s) {
  std::vector<std::string> out;
  for (auto v : p.split(s)) out.emplace_back(v);
  return out;
}

// 256 byte tokens + a few merges + two special tokens.
BPEVocab tiny_vocab() {
  BPEVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(bytes_to_unicode(std::string(1, static_cast<char>(b))));
  v.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}};
  for (const auto& [a, b] : v.merges) v.tokens.push_back(a + b);
  v.tokens.push_back("<|im_start|>");
  v.tokens.push_back("<|im_end|>");
  v.types.assign(v.tokens.size(), TokenType::normal);
  v.types[v.tokens.size() - 2] = v.types[v.tokens.size() - 1] = TokenType::control;
  v.eos_id = static_cast<int32_t>(v.tokens.size() - 1);
  return v;
}

/// encode_with_offsets gives encode()'s ids, and every token's range holds exactly its bytes:
/// the ranges tile the text (a bos token: the empty range at 0).
void check_offsets(const BPETokenizer& tok, const std::string& text, bool add_special = false) {
  std::vector<std::pair<size_t, size_t>> off;
  const auto ids = tok.encode_with_offsets(text, off, add_special);
  CHECK(ids == tok.encode(text, add_special));
  REQUIRE(off.size() == ids.size());
  size_t pos = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    INFO("token " << k << " of '" << text << "'");
    if (add_special && k == 0 && ids[0] == tok.bos_id() && tok.vocab().add_bos) {
      CHECK(off[0] == std::make_pair(size_t{0}, size_t{0}));
      continue;
    }
    CHECK(off[k].first == pos);
    CHECK(text.substr(off[k].first, off[k].second - off[k].first) == tok.decode({ids[k]}));
    pos = off[k].second;
  }
  CHECK(pos == text.size());
}

}  // namespace

TEST_CASE("GPT-2 byte map", "[tokenizer]") {
  CHECK(bytes_to_unicode(" ") == "Ġ");
  CHECK(bytes_to_unicode("\n") == "Ċ");
  CHECK(bytes_to_unicode("a") == "a");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::string back;
  REQUIRE(unicode_to_bytes(bytes_to_unicode(all), back));
  CHECK(back == all);
  CHECK(valid_utf8_prefix("ok \xC3\xA9 \xF0\x9F\x98\x80") == 10);
  CHECK(valid_utf8_prefix("ab\xC3") == 2);          // truncated sequence
  CHECK(valid_utf8_prefix("a\xC0\xAF") == 1);       // overlong
  CHECK(valid_utf8_prefix("a\xED\xA0\x80") == 1);   // surrogate
}

TEST_CASE("pre-tokenizer regexes (GPT-2 and SmolLM2)", "[tokenizer]") {
  PreTokenizer gpt2({kGpt2Pattern});
  CHECK(pieces(gpt2, "Hello world's  test 123!?") ==
        std::vector<std::string>{"Hello", " world", "'s", " ", " test", " 123", "!?"});
  CHECK(pieces(gpt2, "a\n\n  b") == std::vector<std::string>{"a", "\n\n ", " b"});
  CHECK(pieces(gpt2, "naïve 日本語") == std::vector<std::string>{"naïve", " 日本語"});
  auto smol = PreTokenizer::from_gguf_name("smollm");
  CHECK(pieces(*smol, "x 2024!") == std::vector<std::string>{"x", " ", "2", "0", "2", "4", "!"});
  REQUIRE_THROWS_WITH(PreTokenizer::from_gguf_name("nope"), Contains("nope") && Contains("smollm"));
  REQUIRE_THROWS_WITH(PreTokenizer({"(unclosed"}), Contains("does not compile"));
  std::string joined;
  for (auto p : smol->split("  mixed 12 text\t\n")) joined += p;
  CHECK(joined == "  mixed 12 text\t\n");
}

TEST_CASE("BPE merges by rank and splits special tokens", "[tokenizer]") {
  BPETokenizer tok(tiny_vocab());
  const int32_t he = tok.token_to_id("he"), ll = tok.token_to_id("ll"), hell = tok.token_to_id("hell"),
                hello = tok.token_to_id("hello"), start = tok.token_to_id("<|im_start|>");
  CHECK(tok.encode("hello") == std::vector<int32_t>{hello});
  CHECK(tok.encode("hellhe") == std::vector<int32_t>{hell, he});
  CHECK(tok.encode("llhe") == std::vector<int32_t>{ll, he});
  CHECK(tok.encode(" w") == std::vector<int32_t>{tok.token_to_id("Ġw")});
  CHECK(tok.encode("<|im_start|>hello") == std::vector<int32_t>{start, hello});
  // parse_special = false: the special text is plain bytes
  CHECK(tok.encode("<|im_start|>", false, false).size() == 12);
  const std::string text = "hello <|im_end|> wörld 😀\n\t ";
  CHECK(tok.decode(tok.encode(text)) == text);
  CHECK(tok.decode(tok.encode("a<|im_end|>b"), /*skip_special=*/true) == "ab");
  REQUIRE_THROWS_WITH(tok.encode("bad \xff byte"), Contains("not valid UTF-8") && Contains("offset 4"));
  REQUIRE_THROWS_WITH(tok.decode({999999}), Contains("999999"));
  BPEVocab bad = tiny_vocab();
  bad.merges.push_back({"zz", "q"});
  REQUIRE_THROWS_WITH(BPETokenizer(bad), Contains("'zz q'"));
}

TEST_CASE("encode_with_offsets: each token's byte range in the text", "[tokenizer]") {
  BPEVocab v = tiny_vocab();
  v.tokens.push_back("<s>");
  v.types.push_back(TokenType::control);
  v.bos_id = static_cast<int32_t>(v.tokens.size() - 1);
  v.add_bos = true;
  const BPETokenizer tok(std::move(v));
  std::vector<std::pair<size_t, size_t>> off;
  // "hello" = one token, " w" = one token, "<|im_end|>" = one special token
  CHECK(tok.encode_with_offsets("hello<|im_end|> wx", off) ==
        std::vector<int32_t>{tok.token_to_id("hello"), tok.eos_id(), tok.token_to_id("Ġw"), 'x'});
  CHECK(off == std::vector<std::pair<size_t, size_t>>{{0, 5}, {5, 15}, {15, 17}, {17, 18}});
  for (const std::string text : {"", "hello <|im_end|> wörld 😀\n\t ", "<|im_start|><|im_end|>", "hellhe llhe  w"}) {
    check_offsets(tok, text);
    check_offsets(tok, text, /*add_special=*/true);
  }
  REQUIRE_THROWS_WITH(tok.encode_with_offsets("bad \xff", off), Contains("not valid UTF-8"));
}

TEST_CASE("tokenizer.json loader", "[tokenizer]") {
  nlohmann::json vocab = nlohmann::json::object();
  BPEVocab v = tiny_vocab();
  for (size_t i = 0; i + 2 < v.tokens.size(); ++i) vocab[v.tokens[i]] = i;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
      {"added_tokens",
       {{{"id", v.tokens.size() - 2}, {"content", "<|im_start|>"}, {"special", true}},
        {{"id", v.tokens.size() - 1}, {"content", "<|im_end|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}}},
  };
  test::TempDir dir("tok_json");
  test::write_bytes(dir.file("tokenizer.json"), j.dump());
  test::write_bytes(dir.file("tokenizer_config.json"), R"({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}})");
  BPETokenizer tok = BPETokenizer::from_hf_file(dir.file("tokenizer.json"));
  BPETokenizer ref(tiny_vocab());
  CHECK(tok.encode("hello <|im_start|> w 42") == ref.encode("hello <|im_start|> w 42"));
  CHECK(tok.encode("12").size() == 2);
  CHECK(tok.eos_id() == ref.eos_id());
  CHECK(tok.bos_id() == ref.token_to_id("<|im_start|>"));
  CHECK(tok.is_special(tok.eos_id()));
  // array-form merges (newer tokenizers) load the same
  for (auto& m : j["model"]["merges"]) {
    auto s = m.get<std::string>();
    m = nlohmann::json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  BPETokenizer tok2 = BPETokenizer::from_hf_json(j, "t.json");
  CHECK(tok2.encode("hellhe") == ref.encode("hellhe"));
  // export -> import keeps ids and specials
  BPETokenizer tok3 = BPETokenizer::from_hf_json(to_hf_json(tok), "re.json", "<|im_start|>", "<|im_end|>");
  CHECK(tok3.encode("hello <|im_start|> w 42") == ref.encode("hello <|im_start|> w 42"));
  CHECK(to_hf_tokenizer_config(tok, "", 128)["eos_token"] == "<|im_end|>");
  j["normalizer"] = {{"type", "NFC"}};
  REQUIRE_THROWS_WITH(BPETokenizer::from_hf_json(j, "t.json"), Contains("t.json") && Contains("normalizer"));
}

TEST_CASE("ChatML template of SmolLM2-Instruct", "[tokenizer][chat]") {
  const ChatTemplate t = ChatTemplate::smollm2();
  std::vector<ChatMessage> conv{{"user", "Hi"}, {"assistant", "Hello!"}};
  const std::string expect =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n";
  CHECK(t.render(conv, false) == expect);
  CHECK(t.render(conv, true) == expect + "<|im_start|>assistant\n");
  std::vector<ChatMessage> with_sys{{"system", "Be brief."}, {"user", "Hi"}};
  CHECK(t.render(with_sys, true) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  std::string trained;
  for (const auto& s : t.render_segments(conv, false))
    if (s.train) trained += s.text;
  CHECK(trained == "Hello!<|im_end|>");
  const std::string jinja =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
      "You are X<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
      "'<|im_end|>' + '\n'}}{% endfor %}";
  CHECK(ChatTemplate::from_jinja(jinja).default_system() == "You are X");
  REQUIRE_THROWS_WITH(ChatTemplate::from_jinja("{{ bos_token }}### Human:"),
                      Contains("not recognised") && Contains("gemma, llama3, mistral"));
  CHECK(ChatTemplate::from_jinja("{{ bos_token }}[INST] {{ m }} [/INST]").kind() == "mistral");
}

TEST_CASE("real SmolLM2 tokenizer matches Hugging Face token ids", "[tokenizer][real]") {
  if (!std::filesystem::exists(kModel)) {
    WARN("SKIP: " << kModel << " is absent (run scripts/fetch-model.sh)");
    return;
  }
  const gguf::GGUFFile g = gguf::GGUFFile::open(kModel);
  const BPETokenizer tok = BPETokenizer::from_gguf(g);
  const auto fx = nlohmann::json::parse(test::read_bytes("tests/golden/tokenizer_ids.json"));
  CHECK(tok.vocab_size() == fx["vocab_size"].get<int64_t>());
  CHECK(tok.bos_id() == fx["bos_token_id"].get<int32_t>());
  CHECK(tok.eos_id() == fx["eos_token_id"].get<int32_t>());
  for (const auto& c : fx["cases"]) {
    INFO("case " << c["name"].get<std::string>());
    const std::string text = c["text"];
    const auto ids = tok.encode(text);
    CHECK(ids == c["ids"].get<std::vector<int32_t>>());
    CHECK(tok.decode(ids) == text);
    check_offsets(tok, text);
  }
  // Exported as tokenizer.json and loaded back: the same ids.
  const BPETokenizer again = BPETokenizer::from_hf_json(to_hf_json(tok), "exported tokenizer.json");
  for (const auto& c : fx["cases"]) CHECK(again.encode(c["text"].get<std::string>()) == c["ids"].get<std::vector<int32_t>>());
  // The chat template read from the GGUF renders exactly what Jinja rendered.
  const ChatTemplate t = ChatTemplate::from_jinja(g.get("tokenizer.chat_template").as_string());
  std::vector<ChatMessage> msgs;
  for (const auto& m : fx["chat"]["messages"]) msgs.push_back({m["role"], m["content"]});
  CHECK(t.render(msgs, true) == fx["chat"]["rendered"].get<std::string>());
}

TEST_CASE("tokenising a few MB takes seconds", "[tokenizer][real][perf]") {
  const char* corpus = "data/bible.txt";
  if (!std::filesystem::exists(kModel) || !std::filesystem::exists(corpus)) {
    WARN("SKIP: " << kModel << " or " << corpus << " is absent (run scripts/fetch-model.sh and scripts/fetch-data.sh)");
    return;
  }
  const BPETokenizer tok = BPETokenizer::from_gguf(gguf::GGUFFile::open(kModel));
  const std::string text = read_file_to_string(corpus);
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("tokenised " << text.size() / 1e6 << " MB into " << ids.size() << " tokens in " << s << " s ("
                    << text.size() / 1e6 / s << " MB/s)");
  CHECK(s < 30.0);  // generous: 2 shared cores; typically a few seconds
  CHECK(tok.decode(ids) == text);
}
