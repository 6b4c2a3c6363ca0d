#include "models/formats/gguf_writer.h"

#include <cstring>

#include "tensor/dtype.h"
#include "tensor/error.h"

namespace dtr::gguf {

Value make_value(ValueType t, uint64_t u) {
  Value v;
  v.type = t;
  v.v = u;
  return v;
}
Value make_int(ValueType t, int64_t i) {
  Value v;
  v.type = t;
  v.v = i;
  return v;
}
Value make_float(ValueType t, double d) {
  Value v;
  v.type = t;
  v.v = d;
  return v;
}
Value make_bool(bool b) {
  Value v;
  v.type = ValueType::bool_;
  v.v = b;
  return v;
}
Value make_string(std::string s) {
  Value v;
  v.type = ValueType::string;
  v.v = std::move(s);
  return v;
}
Value make_array(ValueType elem_type, std::vector<Value> elems) {
  Value v;
  v.type = ValueType::array;
  v.elem_type = elem_type;
  v.v = std::move(elems);
  return v;
}
Value make_string_array(const std::vector<std::string>& s) {
  std::vector<Value> e;
  for (const auto& x : s) e.push_back(make_string(x));
  return make_array(ValueType::string, std::move(e));
}
Value make_i32_array(const std::vector<int32_t>& v) {
  std::vector<Value> e;
  for (auto x : v) e.push_back(make_int(ValueType::i32, x));
  return make_array(ValueType::i32, std::move(e));
}
Value make_f32_array(const std::vector<float>& v) {
  std::vector<Value> e;
  for (auto x : v) e.push_back(make_float(ValueType::f32, x));
  return make_array(ValueType::f32, std::move(e));
}

namespace {
template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}
void put_value(std::string& out, const Value& v) {
  switch (v.type) {
    case ValueType::u8: put<uint8_t>(out, static_cast<uint8_t>(std::get<uint64_t>(v.v))); break;
    case ValueType::u16: put<uint16_t>(out, static_cast<uint16_t>(std::get<uint64_t>(v.v))); break;
    case ValueType::u32: put<uint32_t>(out, static_cast<uint32_t>(std::get<uint64_t>(v.v))); break;
    case ValueType::u64: put<uint64_t>(out, std::get<uint64_t>(v.v)); break;
    case ValueType::i8: put<int8_t>(out, static_cast<int8_t>(std::get<int64_t>(v.v))); break;
    case ValueType::i16: put<int16_t>(out, static_cast<int16_t>(std::get<int64_t>(v.v))); break;
    case ValueType::i32: put<int32_t>(out, static_cast<int32_t>(std::get<int64_t>(v.v))); break;
    case ValueType::i64: put<int64_t>(out, std::get<int64_t>(v.v)); break;
    case ValueType::f32: put<float>(out, static_cast<float>(std::get<double>(v.v))); break;
    case ValueType::f64: put<double>(out, std::get<double>(v.v)); break;
    case ValueType::bool_: put<uint8_t>(out, std::get<bool>(v.v) ? 1 : 0); break;
    case ValueType::string: put_string(out, std::get<std::string>(v.v)); break;
    case ValueType::array: {
      const auto& a = std::get<std::vector<Value>>(v.v);
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, a.size());
      for (const auto& e : a) {
        DTR_CHECK(e.type == v.elem_type, "GGUFWriter: array of ", value_type_name(v.elem_type), " holds a ",
                  value_type_name(e.type));
        put_value(out, e);
      }
      break;
    }
  }
}
}  // namespace

GGUFWriter::GGUFWriter(uint32_t version, uint64_t alignment) : version_(version), alignment_(alignment) {
  DTR_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "GGUFWriter: alignment ", alignment,
            " is not a power of two");
  if (alignment != kDefaultAlignment) add("general.alignment", make_value(ValueType::u32, alignment));
}

void GGUFWriter::add(const std::string& key, Value v) { kv_.emplace_back(key, std::move(v)); }

void GGUFWriter::add_tensor(const std::string& name, const std::vector<int64_t>& ne, uint32_t type, std::string bytes) {
  const TypeTraits& tt = type_traits(type, "GGUFWriter: tensor '" + name + "'");
  int64_t numel = 1;
  for (auto d : ne) numel *= d;
  const int64_t ne0 = ne.empty() ? 1 : ne[0];
  const int64_t expect = ne0 == 0 ? 0 : row_bytes(tt, ne0, "GGUFWriter: tensor '" + name + "'") * (numel / ne0);
  DTR_CHECK(static_cast<int64_t>(bytes.size()) == expect, "GGUFWriter: tensor '", name, "' of type ", tt.name,
            " needs ", expect, " bytes, got ", bytes.size());
  tensors_.push_back({name, ne, type, std::move(bytes)});
}

void GGUFWriter::add_f32_tensor(const std::string& name, const Shape& shape, const std::vector<float>& values,
                                GGMLType as) {
  DTR_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "GGUFWriter: tensor '", name, "' shape ",
            shape, " needs ", shape_numel(shape), " values, got ", values.size());
  std::string b;
  for (float x : values) {
    if (as == GGMLType::F32) put<float>(b, x);
    else if (as == GGMLType::F16) put<uint16_t>(b, f16::float_to_half(x));
    else if (as == GGMLType::BF16) put<uint16_t>(b, bf16(x).bits);
    else DTR_ERROR("GGUFWriter::add_f32_tensor: type must be F32, F16 or BF16");
  }
  add_tensor(name, std::vector<int64_t>(shape.rbegin(), shape.rend()), static_cast<uint32_t>(as), std::move(b));
}

std::string GGUFWriter::header_bytes() const {
  std::string out;
  put<uint32_t>(out, kMagic);
  put<uint32_t>(out, version_);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_string(out, k);
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    put_value(out, v);
  }
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, t.type);
    put<uint64_t>(out, off);
    off += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  out.append((alignment_ - out.size() % alignment_) % alignment_, '\0');
  return out;
}

std::string GGUFWriter::bytes() const {
  std::string out = header_bytes();
  for (const auto& t : tensors_) {
    out += t.data;
    out.append((alignment_ - t.data.size() % alignment_) % alignment_, '\0');
  }
  return out;
}

void GGUFWriter::write(const std::string& path) const {
  // Streams the header and every tensor (no second in-memory copy of the file).
  const std::string h = header_bytes();
  const std::string zeros(alignment_, '\0');
  AtomicFileWriter w(path);
  w.write(h.data(), h.size());
  for (const auto& t : tensors_) {
    w.write(t.data.data(), t.data.size());
    w.write(zeros.data(), (alignment_ - t.data.size() % alignment_) % alignment_);
  }
  w.commit();
}

}  // namespace dtr::gguf
