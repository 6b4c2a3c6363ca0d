#include "models/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <queue>

#include "models/tokenizer/byte_level.h"
#include "tensor/error.h"

namespace dtr::tokenizer {

namespace {
constexpr size_t kMaxCacheEntries = 1 << 18;  // pieces kept by the encode cache before it is reset
inline uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }
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
      if (!t.empty()) {
        specials_.push_back(t);
        special_ids_.push_back(id);
      }
    } else if (!unicode_to_bytes(t, token_bytes_[i])) {
      token_bytes_[i] = t;  // not byte-level text: decode as is
    }
  }
  // Longest first, so "<|im_start|>" wins over a shorter special that is its prefix.
  std::vector<size_t> order(specials_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return specials_[a].size() > specials_[b].size(); });
  std::vector<std::string> s2;
  std::vector<int32_t> i2;
  for (size_t i : order) {
    s2.push_back(specials_[i]);
    i2.push_back(special_ids_[i]);
  }
  specials_.swap(s2);
  special_ids_.swap(i2);

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
    merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(static_cast<int32_t>(r), im->second));
  }
}

const std::string& BPETokenizer::token(int32_t id) const {
  DTR_CHECK(id >= 0 && static_cast<size_t>(id) < vocab_.tokens.size(), "token id ", id, " is outside the vocabulary of ",
            vocab_.tokens.size());
  return vocab_.tokens[static_cast<size_t>(id)];
}

int32_t BPETokenizer::token_to_id(const std::string& text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

bool BPETokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < vocab_.types.size() && vocab_.types[static_cast<size_t>(id)] == TokenType::control;
}

// Merges by rank with a min-heap of candidate pairs ordered by (rank, position): the same
// order as Hugging Face tokenizers' BPE word merge (lowest rank first, leftmost on ties).
void BPETokenizer::bpe(std::string_view piece, std::vector<int32_t>& out, std::vector<size_t>* lens) const {
  struct Sym {
    int32_t id, prev, next;
  };
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Sym> s(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = byte_token_[static_cast<unsigned char>(piece[static_cast<size_t>(i)])];
    if (id < 0) {
      DTR_CHECK(vocab_.unk_id >= 0, "BPE tokenizer: byte 0x", std::hex, int(static_cast<unsigned char>(piece[i])),
                " has no token and there is no unknown token");
    }
    s[static_cast<size_t>(i)] = {id < 0 ? vocab_.unk_id : id, i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t nx = s[static_cast<size_t>(pos)].next;
    if (nx < 0) return;
    auto it = merges_.find(pair_key(s[static_cast<size_t>(pos)].id, s[static_cast<size_t>(nx)].id));
    if (it != merges_.end()) heap.push({it->second.first, pos, s[static_cast<size_t>(pos)].id, s[static_cast<size_t>(nx)].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> dead(static_cast<size_t>(n), false);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = s[static_cast<size_t>(c.pos)];
    if (dead[static_cast<size_t>(c.pos)] || l.id != c.left || l.next < 0) continue;
    Sym& r = s[static_cast<size_t>(l.next)];
    if (r.id != c.right) continue;
    l.id = merges_.at(pair_key(c.left, c.right)).second;
    dead[static_cast<size_t>(l.next)] = true;
    l.next = r.next;
    if (l.next >= 0) s[static_cast<size_t>(l.next)].prev = c.pos;
    push(l.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = s[static_cast<size_t>(i)].next) {
    out.push_back(s[static_cast<size_t>(i)].id);
    if (lens) lens->push_back(static_cast<size_t>((s[static_cast<size_t>(i)].next < 0 ? n : s[static_cast<size_t>(i)].next) - i));
  }
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
  bool first_char[256] = {};
  for (const auto& sp : specials_) first_char[static_cast<unsigned char>(sp[0])] = true;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t hit = -1;
    if (first_char[static_cast<unsigned char>(text[i])]) {
      for (size_t k = 0; k < specials_.size(); ++k)
        if (text.compare(i, specials_[k].size(), specials_[k]) == 0) {
          hit = static_cast<int32_t>(k);
          break;
        }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    if (i > start) encode_plain(text.substr(start, i - start));
    out.push_back(special_ids_[static_cast<size_t>(hit)]);
    if (offsets) offsets->emplace_back(i, i + specials_[static_cast<size_t>(hit)].size());
    i += specials_[static_cast<size_t>(hit)].size();
    start = i;
  }
  if (start < text.size()) encode_plain(text.substr(start));
  return out;
}

std::string BPETokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    DTR_CHECK(id >= 0 && static_cast<size_t>(id) < token_bytes_.size(), "decode: token id ", id,
              " is outside the vocabulary of ", token_bytes_.size());
    if (skip_special && is_special(id)) continue;
    out += token_bytes_[static_cast<size_t>(id)];
  }
  return out;
}

}  // namespace dtr::tokenizer
