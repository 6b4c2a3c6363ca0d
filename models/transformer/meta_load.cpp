// Meta loading: parameters whose recipes read their block of the file (see meta_load.h).
#include "models/transformer/meta_load.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "models/formats/gguf.h"
#include "models/formats/gguf_types.h"
#include "models/formats/hf_config.h"
#include "models/formats/mapped_file.h"
#include "models/formats/sharded_checkpoint.h"
#include "models/transformer/gguf_names.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

/// Number of runs of the last dim in a block of shape `sz`, and the global element index of the
/// first element of run r (row-major over the leading dims, offsets added).
int64_t runs_of(const Shape& sz) {
  if (sz.empty()) return 1;
  return sz.back() == 0 ? 0 : shape_numel(sz) / sz.back();
}
int64_t run_start(const Shape& global, const Shape& offset, const Shape& sz, int64_t r) {
  const Shape gs = contiguous_strides(global);
  const int64_t nd = static_cast<int64_t>(sz.size());
  int64_t base = nd > 0 ? offset[nd - 1] : 0;
  for (int64_t d = nd - 2; d >= 0; --d) {
    base += (offset[d] + r % sz[d]) * gs[d];
    r /= sz[d];
  }
  return base;
}

/// A tensor of a safetensors file: the block's byte runs are copied out of the map (file dtype),
/// then cast into the destination.
class SafetensorsBlock final : public InitSource {
 public:
  SafetensorsBlock(std::shared_ptr<const safetensors::SafetensorsFile> f, std::string name)
      : f_(std::move(f)), name_(std::move(name)) {}

  void fill(const Shape& global, const Shape& offset, Tensor& out) const override {
    const auto& e = f_->entry(name_);
    DTR_CHECK(e.shape == global, f_->path(), ": tensor '", name_, "' has shape ", e.shape, ", the model needs ", global);
    const std::string_view raw = f_->raw(name_);
    const size_t es = itemsize(e.dtype);
    const Shape& sz = out.sizes();
    const int64_t last = sz.empty() ? 1 : sz.back();
    const bool direct = out.device().is_cpu() && out.is_contiguous() && out.dtype() == e.dtype;
    Tensor tmp = direct ? out : empty(sz, TensorOptions(e.dtype));
    char* dst = static_cast<char*>(tmp.data_ptr());
    const int64_t n = runs_of(sz);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t g = run_start(global, offset, sz, r);
      std::memcpy(dst + static_cast<size_t>(r * last) * es, raw.data() + static_cast<size_t>(g) * es,
                  static_cast<size_t>(last) * es);
    }
    if (!direct) out.copy_(tmp);
    release_mapped_range(raw.data(), raw.size());
  }
  std::string str() const override { return f_->path() + ": " + name_; }

 private:
  std::shared_ptr<const safetensors::SafetensorsFile> f_;
  std::string name_;
};

/// A grouped expert tensor ([E, rows, cols], transformers 5's mlp.experts.gate_up_proj /
/// down_proj) of a checkpoint storing experts one by one: expert e's rows are its `parts`
/// ([rows_p, cols] tensors, e.g. gate_proj then up_proj: moe.cpp's group_expert_weights) laid
/// end to end. A block reads, for each expert in it, only the byte runs of its rows and columns
/// of each part (SafetensorsBlock), so a rank under ep reads its experts alone.
class GroupedExpertsBlock final : public InitSource {
 public:
  struct Part {
    std::shared_ptr<const safetensors::SafetensorsFile> file;
    std::string name;
    int64_t rows = 0;
  };
  explicit GroupedExpertsBlock(std::vector<std::vector<Part>> experts) : experts_(std::move(experts)) {}

  void fill(const Shape& global, const Shape& offset, Tensor& out) const override {
    DTR_CHECK(global.size() == 3 && static_cast<int64_t>(experts_.size()) == global[0], str(), ": expected [",
              experts_.size(), ", rows, cols], the model needs ", global);
    const Shape& sz = out.sizes();
    for (int64_t i = 0; i < sz[0]; ++i) {
      Tensor dst_e = squeeze(out.narrow(0, i, 1), 0);  // [block rows, block cols]
      int64_t first = 0;  // first row of the part in the expert
      for (const Part& p : experts_[offset[0] + i]) {
        const int64_t lo = std::max(first, offset[1]), hi = std::min(first + p.rows, offset[1] + sz[1]);
        if (lo < hi) {
          Tensor dst = dst_e.narrow(0, lo - offset[1], hi - lo);
          SafetensorsBlock(p.file, p.name).fill({p.rows, global[2]}, {lo - first, offset[2]}, dst);
        }
        first += p.rows;
      }
      DTR_CHECK(first == global[1], str(), ": expert ", offset[0] + i, " has ", first, " rows, the model needs ", global[1]);
    }
  }
  std::string str() const override {
    return experts_.empty() || experts_[0].empty() ? "grouped experts"
                                                   : experts_[0][0].file->path() + ": " + experts_[0][0].name + " ...";
  }

 private:
  std::vector<std::vector<Part>> experts_;
};

/// A GGUF tensor (HF order): per HF row of the block, its GGUF row (llama.cpp's Q/K permutation;
/// of a joined tensor, the row of the part holding it) and only the quantisation blocks covering
/// the block's columns are dequantised; then the family's norm shift is taken off, in f32 as
/// load_gguf_state_dict does. 1-d, 2-d and 3-d (experts [E, rows, cols]) tensors.
class GGUFBlock final : public InitSource {
 public:
  /// `names`: the GGUF tensors of the HF tensor, joined along its second-to-last dim.
  GGUFBlock(std::shared_ptr<const gguf::GGUFFile> g, std::vector<std::string> names, int64_t permute_heads, double shift)
      : g_(std::move(g)), names_(std::move(names)), heads_(permute_heads), shift_(shift) {}

  void fill(const Shape& global, const Shape& offset, Tensor& out) const override {
    const int64_t nparts = static_cast<int64_t>(names_.size());
    const Shape part_shape = gguf_part_shape(global, static_cast<int>(nparts));
    struct Part {
      const gguf::TypeTraits* tt;
      const uint8_t* base;
      std::string_view raw;
    };
    std::vector<Part> parts;
    for (const auto& name : names_) {
      const auto& ti = g_->tensor_info(name);
      DTR_CHECK(ti.shape() == part_shape, g_->path(), ": tensor '", name, "' has shape ", ti.shape(),
                ", the model needs ", part_shape);
      const std::string ctx = g_->path() + ": tensor '" + name + "'";
      const std::string_view raw = g_->raw(name);
      parts.push_back({&gguf::type_traits(ti.type, ctx), reinterpret_cast<const uint8_t*>(raw.data()), raw});
    }
    const std::string ctx = g_->path() + ": tensor '" + names_[0] + "'";
    DTR_CHECK(!global.empty() && global.size() <= 3, ctx, ": has ", global.size(),
              " dims; sharded GGUF reads handle 1-d, 2-d and 3-d tensors");
    const int64_t nd = static_cast<int64_t>(global.size());
    const Shape& sz = out.sizes();
    // A 1-d tensor is one row of values, except under the Q/K permutation (a bias), where each
    // value is its own row of 1 (unpermute_qk treats a bias as [rows, 1]).
    const bool one_d = nd == 1;
    const int64_t nc = one_d ? (heads_ ? 1 : sz[0]) : sz[nd - 1];
    const int64_t c0 = one_d ? (heads_ ? 0 : offset[0]) : offset[nd - 1];
    // HF rows of the block: the leading dims flattened (3-d: expert e, row r of the expert).
    const int64_t n_outer = nd == 3 ? sz[0] : 1;
    const int64_t nr = one_d ? (heads_ ? sz[0] : 1) : sz[nd - 2];
    const int64_t r_off = one_d ? (heads_ ? offset[0] : 0) : offset[nd - 2];
    const int64_t rows = one_d ? (heads_ ? global[0] : 1) : global[nd - 2];  // HF rows per expert
    const int64_t part_rows = rows / nparts;
    const int64_t row_values = one_d ? global[0] : global[nd - 1];  // GGUF ne[0]
    if (heads_) DTR_CHECK(rows % (2 * heads_) == 0, ctx, ": ", rows, " rows are not divisible by 2 x ", heads_, " heads");
    const int64_t d = heads_ ? rows / heads_ : 1;
    Tensor tmp = empty(sz, TensorOptions(DType::f32));
    float* dst = tmp.data<float>();
    std::vector<float> scratch;
    for (int64_t o = 0; o < n_outer; ++o) {
      const int64_t e = nd == 3 ? offset[0] + o : 0;
      for (int64_t i = 0; i < nr; ++i) {
        int64_t r = r_off + i;
        if (heads_) {  // hf_row[h*d + j*(d/2) + k] = gguf_row[h*d + 2*k + j]
          const int64_t h = r / d, w = r % d, j = w / (d / 2), k = w % (d / 2);
          r = h * d + 2 * k + j;
        }
        const Part& pt = parts[static_cast<size_t>(r / part_rows)];
        const int64_t row = e * part_rows + r % part_rows;  // row of the part's [E * rows, cols]
        const int64_t row_b = gguf::row_bytes(*pt.tt, row_values, ctx);
        const int64_t bs = pt.tt->block_size;
        // GGUF position of (row, column c0): a 1-d permuted tensor is a row of values.
        const int64_t first = one_d && heads_ ? r : c0;
        const int64_t row_start = one_d ? 0 : row * row_b;
        const int64_t b0 = first / bs, b1 = (first + nc + bs - 1) / bs;
        scratch.resize(static_cast<size_t>((b1 - b0) * bs));
        pt.tt->dequantize(pt.base + row_start + b0 * pt.tt->type_size, scratch.data(), (b1 - b0) * bs);
        std::memcpy(dst + (o * nr + i) * nc, scratch.data() + (first - b0 * bs), static_cast<size_t>(nc) * sizeof(float));
      }
    }
    if (shift_ != 0)
      for (int64_t i = 0; i < tmp.numel(); ++i) dst[i] -= static_cast<float>(shift_);
    out.copy_(tmp);
    for (const Part& pt : parts) release_mapped_range(pt.raw.data(), pt.raw.size());
  }
  std::string str() const override { return g_->path() + ": " + names_[0]; }

 private:
  std::shared_ptr<const gguf::GGUFFile> g_;
  std::vector<std::string> names_;
  int64_t heads_;
  double shift_;
};

/// Strict key check of load_state_dict (load.cpp's rules): every model key in `have`, nothing else.
void check_keys(const CausalLM& m, const std::set<std::string>& have, const std::string& source,
                const std::string& what_missing = "") {
  std::vector<std::string> missing, unexpected;
  std::set<std::string> want;
  for (const auto& [fqn, t] : m.state_dict()) {
    want.insert(fqn);
    const bool tied_head = m.tied() && fqn == "lm_head.weight";
    if (!have.count(fqn) && !tied_head) missing.push_back(what_missing.empty() ? fqn : what_missing + fqn);
  }
  for (const auto& k : have)
    if (!want.count(k)) unexpected.push_back(k);
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "\"" : ", \"") + x + "\"";
    return s;
  };
  DTR_CHECK(missing.empty() && unexpected.empty(), source, ": load_state_dict: error(s) in loading state_dict for ",
            m.type_name(), ":", missing.empty() ? "" : " Missing key(s) in state_dict: " + join(missing) + ".",
            unexpected.empty() ? "" : " Unexpected key(s) in state_dict: " + join(unexpected) + ".");
}

/// Gives every parameter of `m` its source (lm_head of a tied model: the embedding's, the same tensor).
template <class Make>
void attach(CausalLM& m, const std::string& source, Make make) {
  for (const auto& [fqn, p] : m.named_parameters()) {
    DTR_CHECK(is_meta(p), source, ": parameter '", fqn, "' is not meta");
    set_init_source(p, make(fqn, p));
  }
}

std::shared_ptr<CausalLM> build_meta(const ModelConfig& c, DType dtype) {
  MetaInitGuard meta;
  return std::make_shared<CausalLM>(c, dtype, /*init=*/false);
}

std::shared_ptr<CausalLM> load_gguf_meta(const std::string& path, DType dtype) {
  auto g = std::make_shared<const gguf::GGUFFile>(gguf::GGUFFile::open(path));
  const ModelConfig c = model_config_from_gguf(*g);
  auto m = build_meta(c, dtype);
  const std::set<std::string> have = check_gguf_tensors(*g, c);
  check_keys(*m, have, path);
  attach(*m, path, [&](const std::string& fqn, const Tensor&) -> std::shared_ptr<const InitSource> {
    return std::make_shared<GGUFBlock>(g, hf_to_gguf_names(fqn, c.model_type), qk_permute_heads(fqn, c),
                                       gguf_value_shift(fqn, c));
  });
  return m;
}

/// MoE checkpoints storing experts one by one (HF Qwen3-MoE mlp.experts.N.{gate,up,down}_proj,
/// Mixtral block_sparse_moe.experts.N.w{1,3,2}): the grouped parameters' parts per expert, in
/// group_expert_weights' order (models/families/moe.cpp), their names taken out of `files`;
/// Mixtral's block_sparse_moe.gate.weight is renamed mlp.gate.weight. Checkpoints grouped
/// already are left as they are.
using CheckpointFiles = std::map<std::string, std::shared_ptr<const safetensors::SafetensorsFile>>;
std::map<std::string, std::vector<std::vector<GroupedExpertsBlock::Part>>> take_expert_parts(const ModelConfig& c,
                                                                                              CheckpointFiles& files,
                                                                                              const std::string& path) {
  std::map<std::string, std::vector<std::vector<GroupedExpertsBlock::Part>>> out;
  if (c.num_experts <= 0) return out;
  const bool mixtral = c.model_type == "mixtral";
  const std::string mod = mixtral ? "block_sparse_moe." : "mlp.";
  const std::vector<std::string> gate_up = mixtral ? std::vector<std::string>{"w1", "w3"} : std::vector<std::string>{"gate_proj", "up_proj"};
  const std::string down = mixtral ? "w2" : "down_proj";
  auto take = [&](const std::string& k) {
    auto it = files.find(k);
    DTR_CHECK(it != files.end(), path, ": missing tensor '", k, "' (experts stored one by one)");
    const auto& e = it->second->entry(k);
    DTR_CHECK(e.shape.size() == 2, path, ": tensor '", k, "' has shape ", e.shape, ", expected [rows, cols]");
    GroupedExpertsBlock::Part p{it->second, k, e.shape[0]};
    files.erase(it);
    return p;
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string L = "model.layers." + std::to_string(l) + ".";
    if (files.count(L + "mlp.experts.gate_up_proj")) continue;  // grouped already
    auto& gu = out[L + "mlp.experts.gate_up_proj"];
    auto& dn = out[L + "mlp.experts.down_proj"];
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string E = L + mod + "experts." + std::to_string(e) + ".";
      gu.push_back({take(E + gate_up[0] + ".weight"), take(E + gate_up[1] + ".weight")});
      dn.push_back({take(E + down + ".weight")});
    }
    if (mixtral) {
      auto it = files.find(L + mod + "gate.weight");
      DTR_CHECK(it != files.end(), path, ": missing tensor '", L + mod + "gate.weight", "'");
      files[L + "mlp.gate.weight"] = it->second;
      files.erase(it);
    }
  }
  return out;
}

std::shared_ptr<CausalLM> load_hf_meta(const std::string& path, DType dtype) {
  const ModelConfig c = load_model_config(path);
  auto files = safetensors::open_checkpoint(path);
  for (auto it = files.begin(); it != files.end();) it = it->first.ends_with("rotary_emb.inv_freq") ? files.erase(it) : std::next(it);
  // Mixtral's router: the file's name for the tensor of mlp.gate.weight.
  std::map<std::string, std::string> file_name;
  if (c.model_type == "mixtral")
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      file_name["model.layers." + std::to_string(l) + ".mlp.gate.weight"] =
          "model.layers." + std::to_string(l) + ".block_sparse_moe.gate.weight";
  auto experts = take_expert_parts(c, files, path);
  auto m = build_meta(c, dtype);
  std::set<std::string> have;
  for (const auto& [k, f] : files) have.insert(k);
  for (const auto& [k, parts] : experts) have.insert(k);
  check_keys(*m, have, path);
  auto name_in_file = [&](const std::string& fqn) { return file_name.count(fqn) ? file_name.at(fqn) : fqn; };
  const auto params = m->named_parameters();
  for (const auto& [fqn, p] : params) {
    if (experts.count(fqn)) {
      const auto& ex = experts.at(fqn);
      int64_t rows = 0;
      for (const auto& part : ex[0]) rows += part.rows;
      const Shape got{static_cast<int64_t>(ex.size()), rows, ex[0][0].file->entry(ex[0][0].name).shape[1]};
      DTR_CHECK(got == p.sizes(), path, ": load_state_dict: size mismatch for ", fqn,
                ": copying a param with shape ", got, " from checkpoint (experts grouped), the shape in current model is ",
                p.sizes());
      continue;
    }
    const auto& e = files.at(fqn)->entry(name_in_file(fqn));
    DTR_CHECK(e.shape == p.sizes(), path, ": load_state_dict: size mismatch for ", fqn, ": copying a param with shape ",
              e.shape, " from checkpoint, the shape in current model is ", p.sizes());
  }
  attach(*m, path, [&](const std::string& fqn, const Tensor&) -> std::shared_ptr<const InitSource> {
    if (experts.count(fqn)) return std::make_shared<GroupedExpertsBlock>(experts.at(fqn));
    return std::make_shared<SafetensorsBlock>(files.at(fqn), name_in_file(fqn));
  });
  return m;
}

}  // namespace

std::shared_ptr<CausalLM> load_model_meta(const std::string& path, DType dtype) {
  if (path.ends_with(".gguf")) return load_gguf_meta(path, dtype);
  return load_hf_meta(path, dtype);
}

}  // namespace dtr
