#include "models/formats/gguf.h"

#include <cstring>
#include <sstream>

#include "tensor/error.h"

namespace dtr::gguf {

namespace {

constexpr int kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;   // nested arrays deeper than this are treated as corrupt

// Bounds-checked little-endian cursor over the mapped bytes.
struct Cursor {
  const uint8_t* p;
  uint64_t size;
  uint64_t off = 0;
  const std::string& file;

  uint64_t left() const { return size - off; }
  void need(uint64_t n, const char* what, const std::string& key) const {
    DTR_CHECK(n <= left(), file, ": truncated: ", what, key.empty() ? "" : " of '", key, key.empty() ? "" : "'",
              " needs ", n, " bytes at offset ", off, " but the file has ", size, " bytes");
  }
  template <class T>
  T read(const char* what, const std::string& key = {}) {
    need(sizeof(T), what, key);
    T v;
    std::memcpy(&v, p + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
  std::string read_string(const char* what, const std::string& key = {}) {
    const uint64_t start = off;
    const uint64_t n = read<uint64_t>(what, key);
    DTR_CHECK(n <= left(), file, ": truncated: ", what, key.empty() ? "" : " of '", key, key.empty() ? "" : "'",
              " at offset ", start, " has length ", n, " which runs past the end of the file (", size, " bytes)");
    std::string s(reinterpret_cast<const char*>(p + off), n);
    off += n;
    return s;
  }
};

// Smallest encoded size of one value of `t` (used to reject absurd counts early).
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::u8: case ValueType::i8: case ValueType::bool_: return 1;
    case ValueType::u16: case ValueType::i16: return 2;
    case ValueType::u32: case ValueType::i32: case ValueType::f32: return 4;
    case ValueType::u64: case ValueType::i64: case ValueType::f64: case ValueType::string: return 8;
    case ValueType::array: return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::f64); }

Value read_value(Cursor& c, ValueType t, const std::string& key, int depth) {
  Value v;
  v.type = t;
  switch (t) {
    case ValueType::u8: v.v = static_cast<uint64_t>(c.read<uint8_t>("value", key)); break;
    case ValueType::i8: v.v = static_cast<int64_t>(c.read<int8_t>("value", key)); break;
    case ValueType::u16: v.v = static_cast<uint64_t>(c.read<uint16_t>("value", key)); break;
    case ValueType::i16: v.v = static_cast<int64_t>(c.read<int16_t>("value", key)); break;
    case ValueType::u32: v.v = static_cast<uint64_t>(c.read<uint32_t>("value", key)); break;
    case ValueType::i32: v.v = static_cast<int64_t>(c.read<int32_t>("value", key)); break;
    case ValueType::u64: v.v = c.read<uint64_t>("value", key); break;
    case ValueType::i64: v.v = c.read<int64_t>("value", key); break;
    case ValueType::f32: v.v = static_cast<double>(c.read<float>("value", key)); break;
    case ValueType::f64: v.v = c.read<double>("value", key); break;
    case ValueType::bool_: {
      const uint64_t at = c.off;
      const uint8_t b = c.read<uint8_t>("value", key);
      DTR_CHECK(b <= 1, c.file, ": key '", key, "': bool value ", int(b), " at offset ", at, " is not 0 or 1");
      v.v = b == 1;
      break;
    }
    case ValueType::string: v.v = c.read_string("string value", key); break;
    case ValueType::array: {
      DTR_CHECK(depth < kMaxArrayDepth, c.file, ": key '", key, "': arrays nested deeper than ", kMaxArrayDepth);
      const uint64_t at = c.off;
      const uint32_t et = c.read<uint32_t>("array element type", key);
      DTR_CHECK(valid_type(et), c.file, ": key '", key, "': unknown array element type ", et, " at offset ", at);
      v.elem_type = static_cast<ValueType>(et);
      const uint64_t n = c.read<uint64_t>("array length", key);
      DTR_CHECK(n <= c.left() / min_value_bytes(v.elem_type), c.file, ": key '", key, "': array length ", n,
                " at offset ", at + 4, " is more than the ", c.left(), " bytes left can hold");
      std::vector<Value> arr;
      arr.reserve(n);
      for (uint64_t i = 0; i < n; ++i) arr.push_back(read_value(c, v.elem_type, key, depth + 1));
      v.v = std::move(arr);
      break;
    }
  }
  return v;
}

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "?";
}

// ---- Value ------------------------------------------------------------------------------------
bool Value::is_integer() const { return std::holds_alternative<uint64_t>(v) || std::holds_alternative<int64_t>(v); }

int64_t Value::as_int() const {
  if (auto* u = std::get_if<uint64_t>(&v)) {
    DTR_CHECK(*u <= static_cast<uint64_t>(INT64_MAX), "GGUF value ", *u, " does not fit int64");
    return static_cast<int64_t>(*u);
  }
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  DTR_ERROR("GGUF value of type ", value_type_name(type), " is not an integer");
}
double Value::as_float() const {
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (is_integer()) return static_cast<double>(as_int());
  DTR_ERROR("GGUF value of type ", value_type_name(type), " is not a number");
}
bool Value::as_bool() const {
  if (auto* b = std::get_if<bool>(&v)) return *b;
  DTR_ERROR("GGUF value of type ", value_type_name(type), " is not a bool");
}
const std::string& Value::as_string() const {
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  DTR_ERROR("GGUF value of type ", value_type_name(type), " is not a string");
}
const std::vector<Value>& Value::as_array() const {
  if (auto* a = std::get_if<std::vector<Value>>(&v)) return *a;
  DTR_ERROR("GGUF value of type ", value_type_name(type), " is not an array");
}
std::vector<std::string> Value::as_string_array() const {
  std::vector<std::string> out;
  for (const auto& e : as_array()) out.push_back(e.as_string());
  return out;
}
std::vector<int64_t> Value::as_int_array() const {
  std::vector<int64_t> out;
  for (const auto& e : as_array()) out.push_back(e.as_int());
  return out;
}
std::vector<double> Value::as_float_array() const {
  std::vector<double> out;
  for (const auto& e : as_array()) out.push_back(e.as_float());
  return out;
}
std::string Value::str() const {
  std::ostringstream os;
  if (auto* u = std::get_if<uint64_t>(&v)) os << *u;
  else if (auto* i = std::get_if<int64_t>(&v)) os << *i;
  else if (auto* d = std::get_if<double>(&v)) os << *d;
  else if (auto* b = std::get_if<bool>(&v)) os << (*b ? "true" : "false");
  else if (auto* s = std::get_if<std::string>(&v)) os << '"' << (s->size() > 60 ? s->substr(0, 60) + "..." : *s) << '"';
  else {
    const auto& a = as_array();
    os << "array<" << value_type_name(elem_type) << ">[" << a.size() << "] {";
    for (size_t i = 0; i < a.size() && i < 4; ++i) os << (i ? ", " : "") << a[i].str();
    os << (a.size() > 4 ? ", ...}" : "}");
  }
  return os.str();
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

// ---- GGUFFile ---------------------------------------------------------------------------------
GGUFFile GGUFFile::open(const std::string& path) { return parse(MappedFile::open(path)); }

GGUFFile GGUFFile::parse(std::shared_ptr<MappedFile> file) {
  GGUFFile g;
  g.file_ = std::move(file);
  const std::string& fn = g.file_->path();
  Cursor c{g.file_->data(), g.file_->size(), 0, fn};

  DTR_CHECK(c.size >= 4, fn, ": not a GGUF file (", c.size, " bytes)");
  const uint32_t magic = c.read<uint32_t>("magic");
  DTR_CHECK(magic == kMagic, fn, ": bad magic at offset 0: expected \"GGUF\", got 0x", std::hex, magic);
  g.version_ = c.read<uint32_t>("version");
  DTR_CHECK(g.version_ != 0x02000000u && g.version_ != 0x03000000u, fn, ": big-endian GGUF is not supported");
  DTR_CHECK(g.version_ == 2 || g.version_ == 3, fn, ": unsupported GGUF version ", g.version_,
            " at offset 4 (supported: 2, 3)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata kv count");
  // Each kv needs >= 8 (key length) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 4 + 8.
  DTR_CHECK(n_kv <= c.left() / 13, fn, ": metadata kv count ", n_kv, " at offset 16 is absurd for a ", c.size,
            "-byte file");
  DTR_CHECK(n_tensors <= c.left() / 24, fn, ": tensor count ", n_tensors, " at offset 8 is absurd for a ", c.size,
            "-byte file");

  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = c.off;
    std::string key = c.read_string("metadata key");
    const uint32_t t = c.read<uint32_t>("value type", key);
    DTR_CHECK(valid_type(t), fn, ": key '", key, "' at offset ", at, " has unknown value type ", t);
    Value v = read_value(c, static_cast<ValueType>(t), key, 0);
    DTR_CHECK(g.kv_.count(key) == 0, fn, ": duplicate metadata key '", key, "' at offset ", at);
    g.keys_.push_back(key);
    g.kv_.emplace(std::move(key), std::move(v));
  }
  if (g.has("general.alignment")) {
    const Value& a = g.get("general.alignment");
    DTR_CHECK(a.is_integer(), fn, ": general.alignment is not an integer");
    const int64_t al = a.as_int();
    DTR_CHECK(al > 0 && (al & (al - 1)) == 0 && al <= (1 << 20), fn, ": general.alignment = ", al,
              " is not a power of two");
    g.alignment_ = static_cast<uint64_t>(al);
  }

  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.off;
    TensorInfo ti;
    ti.name = c.read_string("tensor name");
    const uint32_t nd = c.read<uint32_t>("n_dims", ti.name);
    DTR_CHECK(nd <= kMaxDims, fn, ": tensor '", ti.name, "' at offset ", at, " has ", nd, " dims (max ", kMaxDims, ")");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t ne = c.read<uint64_t>("dim", ti.name);
      DTR_CHECK(ne <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(numel, ne, &numel) &&
                    numel <= static_cast<uint64_t>(INT64_MAX),
                fn, ": tensor '", ti.name, "' at offset ", at, ": dims overflow");
      ti.ne.push_back(static_cast<int64_t>(ne));
    }
    ti.type = c.read<uint32_t>("tensor type", ti.name);
    ti.offset = c.read<uint64_t>("tensor offset", ti.name);
    const std::string ctx = fn + ": tensor '" + ti.name + "'";
    const TypeTraits& tt = type_traits(ti.type, ctx);
    const int64_t ne0 = ti.ne.empty() ? 1 : ti.ne[0];
    const uint64_t rb = static_cast<uint64_t>(row_bytes(tt, ne0, ctx));
    const uint64_t rows = ne0 == 0 ? 0 : numel / static_cast<uint64_t>(ne0);
    DTR_CHECK(!__builtin_mul_overflow(rb, rows, &ti.nbytes), ctx, ": byte size overflows");
    DTR_CHECK(ti.offset % g.alignment_ == 0, ctx, ": data offset ", ti.offset, " is not a multiple of the alignment ",
              g.alignment_);
    DTR_CHECK(g.tindex_.count(ti.name) == 0, fn, ": duplicate tensor name '", ti.name, "' at offset ", at);
    g.tindex_[ti.name] = g.tensors_.size();
    g.tensors_.push_back(std::move(ti));
  }
  const uint64_t pad = (g.alignment_ - c.off % g.alignment_) % g.alignment_;
  g.data_offset_ = c.off + pad;
  DTR_CHECK(g.data_offset_ <= c.size || n_tensors == 0, fn, ": data section at offset ", g.data_offset_,
            " starts past the end of the file (", c.size, " bytes)");
  const uint64_t data_size = g.data_offset_ <= c.size ? c.size - g.data_offset_ : 0;
  for (const auto& t : g.tensors_) {
    DTR_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset, fn, ": tensor '", t.name, "' data [",
              g.data_offset_ + t.offset, ", ", g.data_offset_ + t.offset + t.nbytes,
              ") is out of bounds of the file (", c.size, " bytes)");
  }
  return g;
}

const Value& GGUFFile::get(const std::string& key) const {
  auto it = kv_.find(key);
  DTR_CHECK(it != kv_.end(), path(), ": missing GGUF metadata key '", key, "'");
  return it->second;
}

namespace {
template <class F>
auto typed(const GGUFFile& g, const std::string& key, F f) {
  try {
    return f(g.get(key));
  } catch (const Error& e) {
    DTR_ERROR(g.path(), ": metadata key '", key, "': ", e.what());
  }
}
}  // namespace

int64_t GGUFFile::get_int(const std::string& key, int64_t def) const {
  return has(key) ? typed(*this, key, [](const Value& v) { return v.as_int(); }) : def;
}
double GGUFFile::get_float(const std::string& key, double def) const {
  return has(key) ? typed(*this, key, [](const Value& v) { return v.as_float(); }) : def;
}
bool GGUFFile::get_bool(const std::string& key, bool def) const {
  return has(key) ? typed(*this, key, [](const Value& v) { return v.as_bool(); }) : def;
}
std::string GGUFFile::get_string(const std::string& key, const std::string& def) const {
  return has(key) ? typed(*this, key, [](const Value& v) { return v.as_string(); }) : def;
}

const TensorInfo& GGUFFile::tensor_info(const std::string& name) const {
  auto it = tindex_.find(name);
  DTR_CHECK(it != tindex_.end(), path(), ": no tensor named '", name, "'");
  return tensors_[it->second];
}

std::string_view GGUFFile::raw(const std::string& name) const {
  const TensorInfo& t = tensor_info(name);
  return file_->bytes().substr(data_offset_ + t.offset, t.nbytes);
}

std::vector<float> dequantize(const TensorInfo& info, std::string_view raw, const std::string& context) {
  const TypeTraits& tt = type_traits(info.type, context);
  DTR_CHECK(raw.size() == info.nbytes, context, ": expected ", info.nbytes, " bytes, got ", raw.size());
  const int64_t n = info.numel();
  std::vector<float> out(static_cast<size_t>(n));
  if (n > 0) tt.dequantize(reinterpret_cast<const uint8_t*>(raw.data()), out.data(), n);
  return out;
}

std::vector<float> GGUFFile::dequantize(const std::string& name) const {
  return gguf::dequantize(tensor_info(name), raw(name), path() + ": tensor '" + name + "'");
}

Tensor GGUFFile::load_f32(const std::string& name) const {
  std::vector<float> v = dequantize(name);
  return from_vector(v, tensor_info(name).shape());
}

}  // namespace dtr::gguf
