#include "models/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <queue>

#include "models/tokenizer/byte_level.h"
#include "tensor/error.h"

namespace dtr::tokenizer {

namespace {
constexpr size_t kMaxCacheEntries = 1 << 18;  // pieces kept by the encode cache before it is reset
}  // namespace

BPETokenizer::BPETokenizer(BPEVocab vocab) : vocab_(std::move(vocab)) {
  const size_t n = vocab_.tokens.size();
  DTR_CHECK(n > 0, "BPE tokenizer: empty vocabulary");
  DTR_CHECK(n < (1u << 31), "BPE tokenizer: vocabulary too large");
  if (vocab_.types.empty()) vocab_.types.assign(n, TokenType::normal);
  DTR_CHECK(vocab_.types.size() == n, "BPE tokenizer: ", n, " tokens but ", vocab_.types.size(), " token types");
  pre_ = std::make_shared<PreTokenizer>(vocab_.pre_patterns);

  token_to_id_.reserve(n * 2);
  token_bytes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& t = vocab_.tokens[i];
    // Duplicates happen in real vocabularies (e.g. padding "[PAD]" entries): the first wins.
    token_to_id_.emplace(t, id);
    const TokenType ty = vocab_.types[i];
    if (ty == TokenType::control || ty == TokenType::user_defined) {
      token_bytes_[i] = t;
      specials_.add(t, id);
    } else if (!unicode_to_bytes(t, token_bytes_[i])) {
      token_bytes_[i] = t;  // not byte-level text: decode as is
    }
  }
  specials_.finalize();

  for (int b = 0; b < 256; ++b) {
    std::string t;
    append_utf8(byte_to_codepoint(static_cast<uint8_t>(b)), t);
    auto it = token_to_id_.find(t);
    byte_token_[b] = it == token_to_id_.end() ? -1 : it->second;
  }

  merges_.reserve(vocab_.merges.size() * 2);
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const auto& [a, b] = vocab_.merges[r];
    auto ia = token_to_id_.find(a), ib = token_to_id_.find(b), im = token_to_id_.find(a + b);
    DTR_CHECK(ia != token_to_id_.end() && ib != token_to_id_.end() && im != token_to_id_.end(), "BPE tokenizer: merge ",
              r, " '", a, " ", b, "' names a token that is not in the vocabulary");
    merges_.add(ia->second, ib->second, static_cast<int32_t>(r), im->second);
  }
}

const std::string& vocab_token(const std::vector<std::string>& tokens, int32_t id) {
  DTR_CHECK(id >= 0 && static_cast<size_t>(id) < tokens.size(), "token id ", id, " is outside the vocabulary of ",
            tokens.size());
  return tokens[static_cast<size_t>(id)];
}

bool vocab_is_control(const std::vector<TokenType>& types, int32_t id) {
  return id >= 0 && static_cast<size_t>(id) < types.size() && types[static_cast<size_t>(id)] == TokenType::control;
}

const std::string& BPETokenizer::token(int32_t id) const { return vocab_token(vocab_.tokens, id); }

int32_t BPETokenizer::token_to_id(const std::string& text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

bool BPETokenizer::is_special(int32_t id) const { return vocab_is_control(vocab_.types, id); }

// Merges by rank with a min-heap of candidate pairs ordered by (rank, position): the same
// order as Hugging Face tokenizers' BPE word merge (lowest rank first, leftmost on ties).
void BPETokenizer::bpe(std::string_view piece, std::vector<int32_t>& out, std::vector<size_t>* lens) const {
  std::vector<int32_t> ids(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    const int32_t id = byte_token_[static_cast<unsigned char>(piece[i])];
    if (id < 0) {
      DTR_CHECK(vocab_.unk_id >= 0, "BPE tokenizer: byte 0x", std::hex, int(static_cast<unsigned char>(piece[i])),
                " has no token and there is no unknown token");
    }
    ids[i] = id < 0 ? vocab_.unk_id : id;
  }
  std::vector<size_t> l(lens ? piece.size() : 0, 1);
  bpe_merge(merges_, ids, lens ? &l : nullptr);
  out.insert(out.end(), ids.begin(), ids.end());
  if (lens) lens->insert(lens->end(), l.begin(), l.end());
}

void BPETokenizer::piece_offsets(std::string_view piece, size_t begin, const std::vector<int32_t>& ids, size_t first,
                                 Offsets& offsets) const {
  // A token's bytes are what it decodes to, except for the unknown token (one per byte without
  // a token): then the lengths come from BPE itself.
  std::vector<size_t> lens;
  size_t total = 0;
  for (size_t k = first; k < ids.size(); ++k) {
    lens.push_back(token_bytes_[static_cast<size_t>(ids[k])].size());
    total += lens.back();
  }
  if (total != piece.size()) {
    std::vector<int32_t> again;
    lens.clear();
    bpe(piece, again, &lens);
    DTR_CHECK(again.size() == ids.size() - first, "tokenizer: offsets of piece '", piece, "' do not match its tokens");
  }
  for (size_t len : lens) {
    offsets.emplace_back(begin, begin + len);
    begin += len;
  }
}

void BPETokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (vocab_.ignore_merges) {
    auto it = token_to_id_.find(bytes_to_unicode(piece));
    if (it != token_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lk(cache_->mu);
    auto it = cache_->map.find(std::string(piece));
    if (it != cache_->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  bpe(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lk(cache_->mu);
  if (cache_->map.size() >= kMaxCacheEntries) cache_->map.clear();
  cache_->map.emplace(std::string(piece), std::move(ids));
}

std::vector<int32_t> BPETokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  return encode_impl(text, add_special, parse_special, nullptr);
}

std::vector<int32_t> BPETokenizer::encode_with_offsets(std::string_view text, Offsets& offsets, bool add_special,
                                                       bool parse_special) const {
  offsets.clear();
  return encode_impl(text, add_special, parse_special, &offsets);
}

std::vector<int32_t> BPETokenizer::encode_impl(std::string_view text, bool add_special, bool parse_special,
                                               Offsets* offsets) const {
  const size_t ok = valid_utf8_prefix(text);
  DTR_CHECK(ok == text.size(), "tokenizer: input is not valid UTF-8 at byte offset ", ok);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && vocab_.add_bos && vocab_.bos_id >= 0) {
    out.push_back(vocab_.bos_id);
    if (offsets) offsets->emplace_back(0, 0);
  }

  auto encode_plain = [&](std::string_view seg) {
    for (auto piece : pre_->split(seg)) {
      const size_t first = out.size();
      encode_piece(piece, out);
      if (offsets) piece_offsets(piece, static_cast<size_t>(piece.data() - text.data()), out, first, *offsets);
    }
  };
  if (!parse_special || specials_.empty()) {
    encode_plain(text);
    return out;
  }
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t id = -1;
    const size_t len = specials_.match(text, i, id);
    if (len == 0) {
      ++i;
      continue;
    }
    if (i > start) encode_plain(text.substr(start, i - start));
    out.push_back(id);
    if (offsets) offsets->emplace_back(i, i + len);
    i += len;
    start = i;
  }
  if (start < text.size()) encode_plain(text.substr(start));
  return out;
}

std::string BPETokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return decode_token_bytes(token_bytes_, ids, skip_special);
}

}  // namespace dtr::tokenizer
