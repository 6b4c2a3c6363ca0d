#include "models/tokenizer/bpe_merge.h"

#include <algorithm>
#include <queue>

namespace dtr::tokenizer {

void bpe_merge(const MergeTable& merges, std::vector<int32_t>& ids, std::vector<size_t>* lens) {
  struct Sym {
    int32_t id, prev, next;
    size_t len;
  };
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  std::vector<Sym> s(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    s[static_cast<size_t>(i)] = {ids[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1,
                                 lens ? (*lens)[static_cast<size_t>(i)] : 0};
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t nx = s[static_cast<size_t>(pos)].next;
    if (nx < 0) return;
    if (const auto* m = merges.find(s[static_cast<size_t>(pos)].id, s[static_cast<size_t>(nx)].id))
      heap.push({m->first, pos, s[static_cast<size_t>(pos)].id, s[static_cast<size_t>(nx)].id});
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
    l.id = merges.find(c.left, c.right)->second;
    l.len += r.len;
    dead[static_cast<size_t>(l.next)] = true;
    l.next = r.next;
    if (l.next >= 0) s[static_cast<size_t>(l.next)].prev = c.pos;
    push(l.prev);
    push(c.pos);
  }
  ids.clear();
  if (lens) lens->clear();
  for (int32_t i = 0; i >= 0 && i < n; i = s[static_cast<size_t>(i)].next) {
    ids.push_back(s[static_cast<size_t>(i)].id);
    if (lens) lens->push_back(s[static_cast<size_t>(i)].len);
  }
}

void SpecialTokens::add(const std::string& text, int32_t id) {
  if (text.empty()) return;
  texts_.push_back(text);
  ids_.push_back(id);
  first_char_[static_cast<unsigned char>(text[0])] = true;
}

void SpecialTokens::finalize() {
  // Longest first, so "<|im_start|>" wins over a shorter special that is its prefix.
  std::vector<size_t> order(texts_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return texts_[a].size() > texts_[b].size(); });
  std::vector<std::string> t2;
  std::vector<int32_t> i2;
  for (size_t i : order) {
    t2.push_back(texts_[i]);
    i2.push_back(ids_[i]);
  }
  texts_.swap(t2);
  ids_.swap(i2);
}

size_t SpecialTokens::match(std::string_view text, size_t i, int32_t& id) const {
  if (!first_char_[static_cast<unsigned char>(text[i])]) return 0;
  for (size_t k = 0; k < texts_.size(); ++k)
    if (text.compare(i, texts_[k].size(), texts_[k]) == 0) {
      id = ids_[k];
      return texts_[k].size();
    }
  return 0;
}

}  // namespace dtr::tokenizer
