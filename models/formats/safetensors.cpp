#include "models/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "tensor/error.h"

namespace dtr::safetensors {

using nlohmann::json;

namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {
    {DType::f64, "F64"}, {DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
    {DType::i64, "I64"}, {DType::i32, "I32"}, {DType::u8, "U8"},   {DType::bool_, "BOOL"},
};

uint64_t read_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Reads a non-negative JSON integer that fits int64_t.
int64_t json_nonneg_int(const json& j, const std::string& what) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    DTR_CHECK(v <= static_cast<uint64_t>(INT64_MAX), what, ": value ", v, " too large");
    return static_cast<int64_t>(v);
  }
  DTR_CHECK(j.is_number_integer(), what, ": expected a non-negative integer, got ", j.dump());
  int64_t v = j.get<int64_t>();
  DTR_CHECK(v >= 0, what, ": expected a non-negative integer, got ", v);
  return v;
}

}  // namespace

const char* dtype_to_string(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  DTR_ERROR("safetensors: no dtype string for ", t);
}

DType dtype_from_string(const std::string& s, const std::string& context) {
  for (const auto& d : kDTypes)
    if (s == d.name) return d.dtype;
  DTR_ERROR(context, ": unknown or unsupported safetensors dtype '", s,
            "' (supported: F64 F32 F16 BF16 I64 I32 U8 BOOL)");
}

Header parse_header(std::string_view bytes, const std::string& file) {
  DTR_CHECK(bytes.size() >= 8, file, ": not a safetensors file: ", bytes.size(),
            " bytes, the 8-byte header length is missing");
  const uint64_t n = read_u64_le(bytes.data());
  DTR_CHECK(n <= kMaxHeaderBytes, file, ": header length ", n, " at offset 0 exceeds the limit of ",
            kMaxHeaderBytes, " bytes (corrupt file?)");
  DTR_CHECK(8 + n <= bytes.size(), file, ": header length ", n, " at offset 0 runs past the end of the file (",
            bytes.size(), " bytes)");
  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = bytes.size() - h.data_start;

  json j;
  try {
    j = json::parse(bytes.substr(8, n));
  } catch (const json::parse_error& e) {
    DTR_ERROR(file, ": header JSON error at file offset ", 8 + e.byte - (e.byte > 0 ? 1 : 0), ": ", e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
    DTR_ERROR(file, ": JSON error: ", e.what());
  }
  DTR_CHECK(j.is_object(), file, ": header at offset 8 is not a JSON object");

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      DTR_CHECK(v.is_object(), file, ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        DTR_CHECK(m.value().is_string(), file, ": __metadata__[\"", m.key(), "\"] is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string ctx = file + ": tensor '" + key + "'";
    DTR_CHECK(v.is_object(), ctx, ": entry is not an object");
    DTR_CHECK(v.contains("dtype") && v["dtype"].is_string(), ctx, ": missing string 'dtype'");
    DTR_CHECK(v.contains("shape") && v["shape"].is_array(), ctx, ": missing array 'shape'");
    DTR_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2, ctx,
              ": missing 'data_offsets' [begin, end]");
    TensorEntry e;
    e.name = key;
    e.dtype = dtype_from_string(v["dtype"].get<std::string>(), ctx);
    uint64_t nbytes = itemsize(e.dtype);
    for (const auto& d : v["shape"]) {
      int64_t s = json_nonneg_int(d, ctx + " shape");
      e.shape.push_back(s);
      DTR_CHECK(!__builtin_mul_overflow(nbytes, static_cast<uint64_t>(s), &nbytes), ctx, ": shape ", e.shape,
                "... overflows 64 bits");
    }
    DTR_CHECK(nbytes <= static_cast<uint64_t>(INT64_MAX), ctx, ": shape ", e.shape, " overflows");
    e.begin = static_cast<uint64_t>(json_nonneg_int(v["data_offsets"][0], ctx + " data_offsets[0]"));
    e.end = static_cast<uint64_t>(json_nonneg_int(v["data_offsets"][1], ctx + " data_offsets[1]"));
    DTR_CHECK(e.begin <= e.end, ctx, ": data_offsets [", e.begin, ", ", e.end, "] are reversed");
    DTR_CHECK(e.end <= data_size, ctx, ": data_offsets [", e.begin, ", ", e.end, "] (file offsets ",
              h.data_start + e.begin, "..", h.data_start + e.end, ") run past the end of the file (", bytes.size(),
              " bytes)");
    DTR_CHECK(e.end - e.begin == nbytes, ctx, ": shape ", e.shape, " x ", itemsize(e.dtype), " bytes = ", nbytes,
              " but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin, " bytes");
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const auto& a = h.tensors[i - 1];
    const auto& b = h.tensors[i];
    // Empty tensors occupy no bytes and may share an offset with anything.
    if (a.nbytes() == 0 || b.nbytes() == 0) continue;
    DTR_CHECK(b.begin >= a.end, file, ": tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", b.name, "' [",
              b.begin, ", ", b.end, ") overlap");
  }
  return h;
}

std::string make_header(const std::vector<RawTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  json j = json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    DTR_CHECK(t.name != "__metadata__", "safetensors: a tensor may not be called __metadata__");
    DTR_CHECK(seen.insert(t.name).second, "safetensors: duplicate tensor name '", t.name, "'");
    const uint64_t expect = static_cast<uint64_t>(shape_numel(t.shape)) * itemsize(t.dtype);
    DTR_CHECK(expect == t.nbytes, "safetensors: tensor '", t.name, "' shape ", t.shape, " needs ", expect,
              " bytes, got ", t.nbytes);
    j[t.name] = {{"dtype", dtype_to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes}}};
    off += t.nbytes;
  }
  std::string s = j.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

void write_raw(const std::string& path, const std::vector<RawTensor>& tensors,
               const std::map<std::string, std::string>& metadata) {
  const std::string header = make_header(tensors, metadata);
  AtomicFileWriter w(path);
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  w.write(len, 8);
  w.write(header.data(), header.size());
  for (const auto& t : tensors)
    if (t.nbytes) w.write(t.data, t.nbytes);
  w.commit();
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile::open(path);
  f.header_ = parse_header(f.file_->bytes(), path);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_[f.header_.tensors[i].name] = i;
  return f;
}

std::vector<std::string> SafetensorsFile::keys() const {
  std::vector<std::string> k;
  for (const auto& e : header_.tensors) k.push_back(e.name);
  return k;
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  DTR_CHECK(it != index_.end(), path(), ": no tensor named '", name, "'");
  return header_.tensors[it->second];
}

std::string_view SafetensorsFile::raw(const std::string& name) const {
  const auto& e = entry(name);
  return file_->bytes().substr(header_.data_start + e.begin, e.nbytes());
}

Tensor SafetensorsFile::get(const std::string& name, LoadMode mode) const {
  const auto& e = entry(name);
  std::string_view b = raw(name);
  const uint64_t file_off = header_.data_start + e.begin;
  if (mode == LoadMode::view && e.nbytes() > 0 && file_off % itemsize(e.dtype) == 0) {
    auto keep = file_;
    return from_blob(const_cast<char*>(b.data()), e.shape, e.dtype, [keep](void*) mutable { keep.reset(); });
  }
  Tensor t = empty(e.shape, TensorOptions(e.dtype));
  if (!b.empty()) std::memcpy(t.data_ptr(), b.data(), b.size());
  return t;
}

TensorMap load_file(const std::string& path, LoadMode mode) {
  auto f = SafetensorsFile::open(path);
  TensorMap out;
  for (const auto& e : f.header().tensors) out[e.name] = f.get(e.name, mode);
  return out;
}

void save_file(const TensorMap& tensors, const std::string& path, const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Tensor>> order;
  for (const auto& [name, t] : tensors) {
    DTR_CHECK(t.defined(), "save_file(", path, "): tensor '", name, "' is undefined");
    DTR_CHECK(!t.is_distributed(), "save_file(", path, "): tensor '", name,
              "' is distributed; save its full_tensor() or use the distributed checkpoint");
    Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
    order.emplace_back(name, c.is_contiguous() ? c : c.contiguous());
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return itemsize(a.second.dtype()) > itemsize(b.second.dtype());
  });
  std::vector<RawTensor> raw;
  for (const auto& [name, t] : order)
    raw.push_back({name, t.dtype(), t.sizes(), t.numel() ? t.data_ptr() : nullptr, t.nbytes()});
  write_raw(path, raw, metadata);
}

}  // namespace dtr::safetensors
