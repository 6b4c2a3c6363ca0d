// Datasets: packing, chat JSONL with prompt masking, llm.c shards (the sampler: test_sampler.cpp).
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>

#include "models/data/chat_dataset.h"
#include "models/data/packing.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/data/text_dataset.h"
#include "models/data/token_shards.h"
#include "models/formats/gguf.h"
#include "models/test_util.h"
#include "models/tokenizer/byte_level.h"

using namespace dtr;
using namespace dtr::data;
using namespace dtr::tokenizer;
using Catch::Matchers::Contains;

namespace {

// Byte tokens only (no merges) + ChatML specials: token id of byte b is b.
BPETokenizer byte_tokenizer() {
  BPEVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(bytes_to_unicode(std::string(1, static_cast<char>(b))));
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) v.tokens.push_back(s);
  v.types.assign(v.tokens.size(), TokenType::normal);
  for (int i = 256; i < 259; ++i) v.types[static_cast<size_t>(i)] = TokenType::control;
  v.eos_id = 256;
  v.pad_id = 256;
  return BPETokenizer(std::move(v));
}

// The byte tokenizer + "ĊĠ" ("\n " merged, as in GPT-2 vocabularies) and "ĊĊ".
BPETokenizer byte_tokenizer_with_newline_merges() {
  BPETokenizer base = byte_tokenizer();
  BPEVocab v = base.vocab();
  v.merges = {{"Ċ", "Ġ"}, {"Ċ", "Ċ"}};
  for (const auto& [a, b] : v.merges) {
    v.tokens.push_back(a + b);
    v.types.push_back(TokenType::normal);
  }
  return BPETokenizer(std::move(v));
}

}  // namespace

TEST_CASE("plain text packs into seq_len + 1 windows with eos separators", "[data]") {
  const BPETokenizer tok = byte_tokenizer();
  const auto stream = tokenize_documents({"abc", "de"}, tok, tok.eos_id());
  CHECK(stream == std::vector<int32_t>{'a', 'b', 'c', 256, 'd', 'e', 256});
  PackedDataset ds(stream, 3);
  REQUIRE(ds.size() == 2);  // (7 - 1) / 3
  CHECK(ds.window(0) == std::vector<int32_t>{'a', 'b', 'c', 256});
  CHECK(ds.window(1) == std::vector<int32_t>{256, 'd', 'e', 256});
  const Sample s = ds.get(1);
  CHECK(s.input_ids == std::vector<int32_t>{256, 'd', 'e'});
  CHECK(s.labels == std::vector<int32_t>{'d', 'e', 256});
  REQUIRE_THROWS_WITH(ds.window(2), Contains("out of range"));
  CHECK(s.seq_lens.empty());  // no eos id given: one document
  // With the eos id, a window records its documents: a new one after each eos input token.
  PackedDataset docs(stream, 3, 256);
  CHECK(docs.get(0).seq_lens.empty());                          // a b c
  CHECK(docs.get(1).seq_lens == std::vector<int32_t>{1, 2});     // <eos> | d e
  CHECK(split_documents("a\n\nb\n\n\n\nc", "\n\n") == std::vector<std::string>{"a", "b", "c"});

  test::TempDir dir("data_text");
  test::write_bytes(dir.file("a.txt"), "hello world\n");
  PackedDataset f = load_text_dataset({dir.file("a.txt")}, tok, 4);
  CHECK(f.stream().size() == 13);
  test::write_bytes(dir.file("bad.txt"), "ok text \xC3\x28 more");
  REQUIRE_THROWS_WITH(load_text_dataset({dir.file("bad.txt")}, tok, 4),
                      Contains("bad.txt") && Contains("not valid UTF-8 at byte offset 8"));
  REQUIRE_THROWS_WITH(load_text_dataset({dir.file("a.txt")}, tok, 100), Contains("fewer than seq_len + 1"));
}

TEST_CASE("chat JSONL: labels only on assistant answers", "[data][chat]") {
  const BPETokenizer tok = byte_tokenizer();
  const ChatTemplate tmpl = ChatTemplate::chatml();
  test::TempDir dir("data_chat");
  test::write_bytes(dir.file("c.jsonl"),
                    R"({"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A!"}]})"
                    "\n\n"
                    R"({"prompt": "Q?", "response": "A!"})"
                    "\n");
  const auto convs = read_chat_jsonl(dir.file("c.jsonl"));
  REQUIRE(convs.size() == 2);
  CHECK(convs[0].size() == convs[1].size());
  std::vector<int32_t> t;
  std::vector<uint8_t> m;
  tokenize_chat(convs[0], tok, tmpl, t, m);
  // <s>user\nQ?<e>\n<s>assistant\nA!<e>\n : trainable = "A!<e>"
  const std::string rendered = tmpl.render(convs[0], false);
  CHECK(tok.decode(t) == rendered);
  std::vector<int32_t> trained;
  for (size_t i = 0; i < t.size(); ++i)
    if (m[i]) trained.push_back(t[i]);
  CHECK(trained == std::vector<int32_t>{'A', '!', 258});

  const Sample s = make_chat_sample(t, m, 40);
  REQUIRE(s.input_ids.size() == t.size() - 1);  // not padded
  CHECK(make_chat_sample(t, m, 5).input_ids.size() == 5);  // truncated
  std::vector<int32_t> labelled;
  for (size_t i = 0; i < s.labels.size(); ++i)
    if (s.labels[i] != kIgnoreIndex) {
      labelled.push_back(s.labels[i]);
      CHECK(s.labels[i] == t[i + 1]);  // shifted: label i is token i + 1
    }
  CHECK(labelled == trained);

  const auto samples = load_chat_dataset(dir.file("c.jsonl"), tok, tmpl, 64);
  REQUIRE(samples.size() == 2);
  CHECK(samples[0].labels == samples[1].labels);
  const auto n = static_cast<int64_t>(t.size());  // samples hold n - 1 positions: one pad to n
  const Batch b = collate(samples, {256, n, 0, false});
  CHECK(b.input_ids.sizes() == Shape{2, n});
  CHECK(b.input_ids.to_vector<int64_t>().back() == 256);  // padding
  CHECK(b.labels.to_vector<int64_t>().back() == kIgnoreIndex);
  CHECK(b.labels.dtype() == DType::i64);
  CHECK(b.num_label_tokens == 6);
  // truncated before the answer: dropped
  int64_t dropped = 0;
  CHECK(load_chat_dataset(dir.file("c.jsonl"), tok, tmpl, 8, &dropped).empty());
  CHECK(dropped == 2);
}

TEST_CASE("span_mask: a token is trained when its bytes overlap a trainable span", "[data][chat]") {
  // spans [5, 10) and [20, 22)
  const ByteSpans spans{{5, 10}, {20, 22}};
  const ByteSpans offsets{{0, 5},    // ends where the span begins: out
                          {5, 5},    // empty (bos-like): out
                          {4, 6},    // straddles the start: in
                          {6, 9},    // inside: in
                          {9, 12},   // straddles the end: in
                          {12, 20},  // between: out
                          {20, 22},  // exactly the second span: in
                          {22, 30}}; // starts where it ends: out
  CHECK(span_mask(offsets, spans) == std::vector<uint8_t>{0, 0, 1, 1, 1, 0, 1, 0});
  CHECK(span_mask(offsets, {}) == std::vector<uint8_t>(offsets.size(), 0));
  CHECK(span_mask({}, spans).empty());
}

// A reply starting with whitespace: the template's "\n" and the reply's first whitespace are
// one token of the whole conversation ("ĊĠ" / "ĊĊ"), which per-segment tokenisation split.
TEST_CASE("chat: tokens are the tokenizer's ids of the whole conversation, leading whitespace included",
          "[data][chat]") {
  const BPETokenizer tok = byte_tokenizer_with_newline_merges();
  const ChatTemplate tmpl = ChatTemplate::chatml();
  // {reply, trained text}: a token straddling the header's "\n" and the reply is trained
  // whole; the second reply "\n C" always gives "ĊĊ" + " C".
  const std::vector<std::pair<std::string, std::string>> cases{
      {"  A", "\n  A"},  // "assistant" "ĊĠ" "ĠA"
      {"\n\nB", "\n\n\nB"},  // "ĊĊ" "Ċ" "B"
      {" 7 is smaller.", " 7 is smaller."},  // GPT-2 regex: "Ċ" "Ġ7" (no digit split here)
      {"plain", "plain"}};
  for (const auto& [reply, trained_reply] : cases) {
    INFO("reply '" << reply << "'");
    const Conversation conv{{"user", "Q?"}, {"assistant", reply}, {"user", "  again"}, {"assistant", "\n C"}};
    std::vector<int32_t> t;
    std::vector<uint8_t> m;
    tokenize_chat(conv, tok, tmpl, t, m);
    CHECK(t == tok.encode(tmpl.render(conv, false)));
    std::string trained;
    for (size_t i = 0; i < t.size(); ++i)
      if (m[i]) trained += tok.decode({t[i]});
    CHECK(trained == trained_reply + "<|im_end|>" + "\n\n C<|im_end|>");
  }
  const Conversation conv{{"user", "Q?"}, {"assistant", "  A"}};
  std::vector<int32_t> t;
  std::vector<uint8_t> m;
  tokenize_chat(conv, tok, tmpl, t, m);
  const auto it = std::find(t.begin(), t.end(), tok.token_to_id("ĊĠ"));
  REQUIRE(it != t.end());
  CHECK(m[static_cast<size_t>(it - t.begin())] == 1);
}

TEST_CASE("a bad JSONL line reports file:line", "[data][chat][errors]") {
  test::TempDir dir("data_badjsonl");
  const std::string good = R"({"prompt": "a", "response": "b"})";
  auto write = [&](const std::string& third) {
    test::write_bytes(dir.file("x.jsonl"), good + "\n" + good + "\n" + third + "\n");
    return read_chat_jsonl(dir.file("x.jsonl"));
  };
  const std::string where = dir.file("x.jsonl") + ":3";
  REQUIRE_THROWS_WITH(write("{\"prompt\": \"a\", "), Contains(where) && Contains("invalid JSON"));
  REQUIRE_THROWS_WITH(write(R"({"prompt": "a"})"), Contains(where) && Contains("messages"));
  REQUIRE_THROWS_WITH(write(R"({"messages": [{"role": "user"}]})"), Contains(where) && Contains("'content'"));
  REQUIRE_THROWS_WITH(write(R"({"prompt": 1, "response": "b"})"), Contains(where) && Contains("'prompt'"));
  REQUIRE_THROWS_WITH(write("[1]"), Contains(where) && Contains("object"));
  test::write_bytes(dir.file("u.jsonl"), good + "\n\xff\n");
  REQUIRE_THROWS_WITH(read_chat_jsonl(dir.file("u.jsonl")), Contains("u.jsonl") && Contains("byte offset 33"));
}

TEST_CASE("llm.c token shards", "[data][shards]") {
  test::TempDir dir("data_shards");
  std::vector<uint32_t> toks{0, 1, 65535, 42, 7};
  write_token_shard(dir.file("v1.bin"), toks, 1);
  CHECK(std::filesystem::file_size(dir.file("v1.bin")) == 1024 + 10);
  CHECK(read_token_shard(dir.file("v1.bin")) == toks);
  toks.push_back(100000);
  REQUIRE_THROWS_WITH(write_token_shard(dir.file("v1b.bin"), toks, 1), Contains("uint16"));
  write_token_shard(dir.file("v2.bin"), toks, 2);
  CHECK(read_token_shard(dir.file("v2.bin")) == toks);

  std::string bytes = test::read_bytes(dir.file("v2.bin"));
  test::write_bytes(dir.file("trunc.bin"), bytes.substr(0, bytes.size() - 2));
  REQUIRE_THROWS_WITH(read_token_shard(dir.file("trunc.bin")), Contains("trunc.bin") && Contains("6 tokens"));
  std::string bad = bytes;
  bad[0] = 'x';
  test::write_bytes(dir.file("magic.bin"), bad);
  REQUIRE_THROWS_WITH(read_token_shard(dir.file("magic.bin")), Contains("bad magic"));
  bad = bytes;
  bad[4] = 9;
  test::write_bytes(dir.file("ver.bin"), bad);
  REQUIRE_THROWS_WITH(read_token_shard(dir.file("ver.bin")), Contains("unknown version 9"));
  PackedDataset ds = load_token_shard_dataset({dir.file("v1.bin"), dir.file("v2.bin")}, 4);
  CHECK(ds.size() == 2);  // 11 tokens -> (11 - 1) / 4
  CHECK(ds.window(1) == std::vector<int32_t>{7, 0, 1, 65535, 42});
  test::write_bytes(dir.file("short.bin"), "abc");
  REQUIRE_THROWS_WITH(read_token_shard(dir.file("short.bin")), Contains("shorter than"));
}

TEST_CASE("real data: perlfaq JSONL with the SmolLM2 tokenizer", "[data][real]") {
  const char* model = "data/smollm2-135m-instruct.gguf";
  const char* faq = "data/perlfaq-val.jsonl";
  if (!std::filesystem::exists(model) || !std::filesystem::exists(faq)) {
    WARN("SKIP: " << model << " or " << faq << " is absent (run scripts/fetch-model.sh and scripts/fetch-data.sh)");
    return;
  }
  const gguf::GGUFFile g = gguf::GGUFFile::open(model);
  const BPETokenizer tok = BPETokenizer::from_gguf(g);
  const ChatTemplate tmpl = ChatTemplate::from_jinja(g.get("tokenizer.chat_template").as_string());
  int64_t dropped = 0;
  const auto samples = load_chat_dataset(faq, tok, tmpl, 512, &dropped);
  CHECK(samples.size() + static_cast<size_t>(dropped) == read_chat_jsonl(faq).size());
  REQUIRE(!samples.empty());
  for (const auto& s : samples) {
    // every sample starts with the prompt (no labels), and has some labels
    CHECK(s.labels[0] == kIgnoreIndex);
    CHECK(std::any_of(s.labels.begin(), s.labels.end(), [](int32_t l) { return l != kIgnoreIndex; }));
  }
}

// tests/golden/chat_mask.json: transformers' apply_chat_template(return_assistant_tokens_mask)
// on the SmolLM2 tokenizer (make_chat_mask_fixture.py): replies starting with spaces and
// newlines, multi-turn, with and without a system message.
TEST_CASE("real SmolLM2 chats: ids and loss mask match transformers' apply_chat_template", "[data][chat][real]") {
  const char* model = "data/smollm2-135m-instruct.gguf";
  if (!std::filesystem::exists(model)) {
    WARN("SKIP: " << model << " is absent (run scripts/fetch-model.sh)");
    return;
  }
  const gguf::GGUFFile g = gguf::GGUFFile::open(model);
  const BPETokenizer tok = BPETokenizer::from_gguf(g);
  const ChatTemplate tmpl = ChatTemplate::from_jinja(g.get("tokenizer.chat_template").as_string());
  const auto fx = nlohmann::json::parse(test::read_bytes("tests/golden/chat_mask.json"));
  int differs = 0;
  for (const auto& c : fx["cases"]) {
    INFO("case " << c["name"].get<std::string>());
    Conversation conv;
    for (const auto& m : c["messages"]) conv.push_back({m["role"], m["content"]});
    CHECK(tmpl.render(conv, false) == c["rendered"].get<std::string>());
    std::vector<int32_t> t;
    std::vector<uint8_t> m;
    tokenize_chat(conv, tok, tmpl, t, m);
    CHECK(t == c["ids"].get<std::vector<int32_t>>());
    CHECK(m == c["assistant_masks"].get<std::vector<uint8_t>>());
    differs += c["per_segment_differs"].get<bool>();
  }
  CHECK(differs >= 4);  // the fixture holds cases where per-segment tokenisation gave other ids
}

namespace {
Sample sample(std::vector<int32_t> ids, std::vector<int32_t> labels) { return Sample{std::move(ids), std::move(labels), {}}; }
}  // namespace

// Hand-computed: sizes 3, 2, 4, 1, 5 into packs of 6 (a sample that does not fit starts the
// next pack; Automodel's pack_dataset with split_across_pack = False).
TEST_CASE("pack_sequences: which samples share a row, padding, seq_lens", "[data][packing]") {
  const std::vector<Sample> in{sample({1, 2, 3}, {2, 3, -100}), sample({4, 5}, {-100, 6}),
                               sample({7, 8, 9, 10}, {8, 9, 10, 11}), sample({12}, {13}),
                               sample({14, 15, 16, 17, 18}, {-100, -100, 17, 18, 19})};
  const auto packs = pack_sequences(in, 6, 0);
  REQUIRE(packs.size() == 3);
  CHECK(packs[0].input_ids == std::vector<int32_t>{1, 2, 3, 4, 5, 0});
  CHECK(packs[0].labels == std::vector<int32_t>{2, 3, -100, -100, 6, -100});
  CHECK(packs[0].seq_lens == std::vector<int32_t>{3, 2, 1});  // the padding is a document
  CHECK(packs[1].input_ids == std::vector<int32_t>{7, 8, 9, 10, 12, 0});
  CHECK(packs[1].labels == std::vector<int32_t>{8, 9, 10, 11, 13, -100});
  CHECK(packs[1].seq_lens == std::vector<int32_t>{4, 1, 1});
  CHECK(packs[2].input_ids == std::vector<int32_t>{14, 15, 16, 17, 18, 0});
  CHECK(packs[2].seq_lens == std::vector<int32_t>{5, 1});
  // An exact fit has no padding document.
  const auto exact = pack_sequences({in[0], in[0]}, 6, 0);
  REQUIRE(exact.size() == 1);
  CHECK(exact[0].seq_lens == std::vector<int32_t>{3, 3});

  const Batch b = collate(packs, {0, 1, 0, true});
  CHECK(b.input_ids.sizes() == Shape{3, 6});
  CHECK(b.position_ids.to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 2, 0, 1, 0, /**/ 0, 1, 2, 3, 0, 0, /**/ 0, 1, 2, 3, 4, 0});
  CHECK(b.document_ids.to_vector<int64_t>() ==
        std::vector<int64_t>{0, 0, 0, 1, 1, 2, /**/ 0, 0, 0, 0, 1, 2, /**/ 0, 0, 0, 0, 0, 1});
  CHECK(b.num_label_tokens == 3 + 5 + 3);

  REQUIRE_THROWS_WITH(pack_sequences(in, 4, 0),
                      Contains("packed_sequence_size=4: sample 4 has 5 tokens, more than a pack holds"));
  REQUIRE_THROWS_WITH(pack_sequences(in, 0, 0), Contains("packed_sequence_size = 0"));
  REQUIRE_THROWS_WITH(pack_sequences(packs, 6, 0), Contains("sample 0 already holds 3 documents"));
}

TEST_CASE("collate pads each batch to its longest sample, rounded up", "[data][packing]") {
  const std::vector<Sample> in{sample({1, 2, 3}, {2, 3, 4}), sample({5}, {-100}), sample({6, 7, 8, 9, 10}, {7, 8, 9, 10, 11})};
  const Batch exact = collate(in, {99, 1, 0, false});
  CHECK(exact.input_ids.sizes() == Shape{3, 5});
  CHECK(exact.input_ids.to_vector<int64_t>() ==
        std::vector<int64_t>{1, 2, 3, 99, 99, /**/ 5, 99, 99, 99, 99, /**/ 6, 7, 8, 9, 10});
  CHECK(exact.labels.to_vector<int64_t>() ==
        std::vector<int64_t>{2, 3, 4, -100, -100, /**/ -100, -100, -100, -100, -100, /**/ 7, 8, 9, 10, 11});
  CHECK(exact.num_label_tokens == 8);
  CHECK(!exact.position_ids.defined());
  const Batch r8 = collate(in, {99, 8, 0, true});
  CHECK(r8.input_ids.sizes() == Shape{3, 8});
  // Unpacked samples are one document each; the padding is the next one.
  CHECK(r8.position_ids.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4, /**/ 0, 0, 1, 2, 3, 4, 5, 6,
                                                                      /**/ 0, 1, 2, 3, 4, 0, 1, 2});
  CHECK(r8.document_ids.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 1, /**/ 0, 1, 1, 1, 1, 1, 1, 1,
                                                                      /**/ 0, 0, 0, 0, 0, 1, 1, 1});
  CHECK(collate({in[2]}, {0, 5, 0, false}).input_ids.sizes() == Shape{1, 5});  // already a multiple
  CHECK(collate(in, {0, 8, 6, false}).input_ids.sizes() == Shape{3, 6});     // capped at max_length
  CHECK(collate(in, {0, 8, 3, false}).input_ids.sizes() == Shape{3, 5});     // never below the longest
  REQUIRE_THROWS_WITH(collate(in, {0, 0, 0, false}), Contains("pad_seq_len_divisible = 0"));
  Sample bad = in[0];
  bad.seq_lens = {2};
  REQUIRE_THROWS_WITH(collate({bad}), Contains("seq_lens summing to 2 but 3 input ids"));
}
