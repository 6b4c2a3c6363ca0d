// Layer split over pipeline stages (see stage_split.h).
#include "parallel/pipeline/stage_split.h"

#include "tensor/error.h"

namespace dtr {

std::vector<int64_t> split_layers(int64_t num_layers, int num_stages, const std::vector<int64_t>& counts,
                                  const std::string& where) {
  DTR_CHECK(num_stages >= 1, where, ": number of pipeline stages must be >= 1, got ", num_stages);
  if (!counts.empty()) {
    DTR_CHECK(static_cast<int64_t>(counts.size()) == num_stages, where, ": ", counts.size(),
              " layer counts for ", num_stages, " pipeline stages");
    int64_t sum = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      DTR_CHECK(counts[i] >= 1, where, ": stage ", i, " has ", counts[i], " layers (every stage needs >= 1)");
      sum += counts[i];
    }
    DTR_CHECK(sum == num_layers, where, ": the layer counts sum to ", sum, ", the model has ", num_layers, " layers");
    return counts;
  }
  DTR_CHECK(num_layers >= num_stages, where, ": ", num_layers, " layers cannot fill ", num_stages,
            " pipeline stages (every stage needs >= 1 layer)");
  std::vector<int64_t> out(num_stages, num_layers / num_stages);
  for (int64_t i = 0; i < num_layers % num_stages; ++i) ++out[i];
  return out;
}

std::vector<std::pair<int64_t, int64_t>> stage_layer_ranges(const std::vector<int64_t>& counts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t b = 0;
  for (int64_t c : counts) {
    out.push_back({b, b + c});
    b += c;
  }
  return out;
}

}  // namespace dtr
