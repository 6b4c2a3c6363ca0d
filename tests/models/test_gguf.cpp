// GGUF: metadata of every value type, dequantisation of each block format against values
// computed by hand from the block formulas, Q/K unpermutation, corrupt files, and the real
// SmolLM2 file against gguf-py (tests/golden/gguf_dequant.json) when it has been fetched.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/qk_permute.h"
#include "models/test_util.h"

using namespace dtr;
using namespace dtr::gguf;
using Catch::Matchers::Contains;

namespace {

const char* kModel = "data/smollm2-135m-instruct.gguf";

void put_f16(std::string& b, float x) {
  uint16_t h = f16::float_to_half(x);
  b.append(reinterpret_cast<const char*>(&h), 2);
}

// Dequantises one tensor of `type` holding `bytes` through a GGUF file round trip.
std::vector<float> dq(GGMLType type, int64_t n, const std::string& bytes) {
  GGUFWriter w;
  w.add_tensor("t", {n}, static_cast<uint32_t>(type), bytes);
  test::TempDir dir("gguf_dq");
  w.write(dir.file("t.gguf"));
  return GGUFFile::open(dir.file("t.gguf")).dequantize("t");
}

}  // namespace

TEST_CASE("GGUF metadata of every value type round-trips", "[gguf]") {
  GGUFWriter w(3, 64);
  w.add("u8", make_value(ValueType::u8, 200));
  w.add("i8", make_int(ValueType::i8, -100));
  w.add("u16", make_value(ValueType::u16, 60000));
  w.add("i16", make_int(ValueType::i16, -30000));
  w.add_u32("u32", 4000000000u);
  w.add("i32", make_int(ValueType::i32, -2000000000));
  w.add("u64", make_value(ValueType::u64, 1ull << 40));
  w.add("i64", make_int(ValueType::i64, -(1ll << 40)));
  w.add_f32("f32", 1.5f);
  w.add("f64", make_float(ValueType::f64, 0.1));
  w.add_bool("bool", true);
  w.add_string("str", "héllo");
  w.add("strs", make_string_array({"a", "", "ccc"}));
  w.add("i32s", make_i32_array({1, -2, 3}));
  w.add("f32s", make_f32_array({0.5f, -0.25f}));
  w.add("nested", make_array(ValueType::array, {make_i32_array({1}), make_i32_array({2, 3})}));
  w.add_f32_tensor("w", {2, 3}, {1, 2, 3, 4, 5, 6});
  test::TempDir dir("gguf_meta");
  w.write(dir.file("m.gguf"));
  GGUFFile g = GGUFFile::open(dir.file("m.gguf"));
  CHECK(g.version() == 3);
  CHECK(g.alignment() == 64);
  CHECK(g.data_offset() % 64 == 0);
  CHECK(g.get("u8").as_int() == 200);
  CHECK(g.get("i8").as_int() == -100);
  CHECK(g.get("u16").as_int() == 60000);
  CHECK(g.get("i16").as_int() == -30000);
  CHECK(g.get("u32").as_int() == 4000000000ll);
  CHECK(g.get("i32").as_int() == -2000000000);
  CHECK(g.get("u64").as_int() == (1ll << 40));
  CHECK(g.get("i64").as_int() == -(1ll << 40));
  CHECK(g.get("f32").as_float() == 1.5);
  CHECK(g.get("f64").as_float() == 0.1);
  CHECK(g.get("bool").as_bool());
  CHECK(g.get("str").as_string() == "héllo");
  CHECK(g.get("strs").as_string_array() == std::vector<std::string>{"a", "", "ccc"});
  CHECK(g.get("i32s").as_int_array() == std::vector<int64_t>{1, -2, 3});
  CHECK(g.get("f32s").as_float_array() == std::vector<double>{0.5, -0.25});
  CHECK(g.get("nested").as_array()[1].as_int_array() == std::vector<int64_t>{2, 3});
  CHECK(g.get_int("missing", 7) == 7);
  REQUIRE_THROWS_WITH(g.get("missing"), Contains("missing") && Contains("m.gguf"));
  REQUIRE_THROWS_WITH(g.get_int("str", 0), Contains("'str'") && Contains("not an integer"));
  const TensorInfo& t = g.tensor_info("w");
  CHECK(t.ne == std::vector<int64_t>{3, 2});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(g.dequantize("w") == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(g.keys().front() == "general.alignment");
}

TEST_CASE("F16 and BF16 tensors dequantise exactly", "[gguf]") {
  GGUFWriter w;
  const std::vector<float> v{1.0f, -2.5f, 0.099975586f, 65504.0f};
  w.add_f32_tensor("h", {4}, v, GGMLType::F16);
  w.add_f32_tensor("b", {4}, {1.0f, -2.5f, 3.140625f, -1e30f}, GGMLType::BF16);
  test::TempDir dir("gguf_f16");
  w.write(dir.file("f.gguf"));
  GGUFFile g = GGUFFile::open(dir.file("f.gguf"));
  CHECK(g.dequantize("h") == v);
  auto b = g.dequantize("b");
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == -2.5f);
  CHECK(b[2] == 3.140625f);
  CHECK(b[3] == float(bf16(-1e30f)));
}

TEST_CASE("Q8_0 dequantisation: x = d * q", "[gguf][quant]") {
  // Block: d = 0.5, qs[j] = j - 16 -> x[j] = (j - 16) / 2. Second block: d = -0.125, qs = 127.
  std::string b;
  put_f16(b, 0.5f);
  for (int j = 0; j < 32; ++j) b += static_cast<char>(static_cast<int8_t>(j - 16));
  put_f16(b, -0.125f);
  for (int j = 0; j < 32; ++j) b += static_cast<char>(127);
  auto y = dq(GGMLType::Q8_0, 64, b);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == (j - 16) * 0.5f);
  for (int j = 32; j < 64; ++j) CHECK(y[j] == -15.875f);
}

TEST_CASE("Q4_0 dequantisation: low nibbles are values 0..15, high nibbles 16..31", "[gguf][quant]") {
  // d = 0.25; qs[j] = (j & 15) | ((15 - j) << 4) -> x[j] = ((j & 15) - 8) d, x[j+16] = (15 - j - 8) d.
  std::string b;
  put_f16(b, 0.25f);
  for (int j = 0; j < 16; ++j) b += static_cast<char>((j & 15) | ((15 - j) << 4));
  auto y = dq(GGMLType::Q4_0, 32, b);
  CHECK(y[0] == -2.0f);    // (0 - 8) * 0.25
  CHECK(y[15] == 1.75f);   // (15 - 8) * 0.25
  CHECK(y[16] == 1.75f);   // high nibble of qs[0] = 15
  CHECK(y[31] == -2.0f);   // high nibble of qs[15] = 0
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == ((j & 15) - 8) * 0.25f);
    CHECK(y[j + 16] == ((15 - j) - 8) * 0.25f);
  }
}

TEST_CASE("Q4_1 dequantisation: x = d * q + m", "[gguf][quant]") {
  // d = 0.5, m = -1; qs[j] = j | (j << 4) -> x[j] = x[j+16] = 0.5 j - 1.
  std::string b;
  put_f16(b, 0.5f);
  put_f16(b, -1.0f);
  for (int j = 0; j < 16; ++j) b += static_cast<char>(j | (j << 4));
  auto y = dq(GGMLType::Q4_1, 32, b);
  CHECK(y[0] == -1.0f);
  CHECK(y[15] == 6.5f);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == 0.5f * j - 1.0f);
    CHECK(y[j + 16] == 0.5f * j - 1.0f);
  }
}

TEST_CASE("Q5_0 and Q5_1: the fifth bit comes from qh", "[gguf][quant]") {
  // qh = 0xAAAAAAAA (bits 1,3,5,... set); qs = 0x00 -> q[j] = 16 * bit j of qh.
  std::string b0, b1;
  put_f16(b0, 1.0f);
  uint32_t qh = 0xAAAAAAAAu;
  b0.append(reinterpret_cast<const char*>(&qh), 4);
  b0.append(16, '\x00');
  auto y0 = dq(GGMLType::Q5_0, 32, b0);
  for (int j = 0; j < 32; ++j) CHECK(y0[j] == static_cast<float>(static_cast<int>((qh >> j) & 1) * 16 - 16));
  put_f16(b1, 2.0f);
  put_f16(b1, 0.5f);
  b1.append(reinterpret_cast<const char*>(&qh), 4);
  for (int j = 0; j < 16; ++j) b1 += static_cast<char>(0x31);  // lo = 1, hi = 3
  auto y1 = dq(GGMLType::Q5_1, 32, b1);
  for (int j = 0; j < 16; ++j) {
    CHECK(y1[j] == 2.0f * static_cast<float>(1 + 16 * ((qh >> j) & 1)) + 0.5f);
    CHECK(y1[j + 16] == 2.0f * static_cast<float>(3 + 16 * ((qh >> (j + 16)) & 1)) + 0.5f);
  }
}

TEST_CASE("Q6_K dequantisation from the block formula", "[gguf][quant]") {
  // Layout {ql[128], qh[64], scales[16] (int8), d (f16)}. Value k (0..255): half n = k / 128,
  // r = k % 128, group g = r / 32, l = r % 32; low 4 bits from ql[64n + l + 32 (g & 1)]
  // (low nibble for g < 2, high for g >= 2), high 2 bits from qh[32n + l] >> 2g,
  // scale = scales[8n + l / 16 + 2g]; x = d * scale * (q - 32).
  std::string b;
  uint8_t ql[128], qh[64];
  int8_t sc[16];
  for (int i = 0; i < 128; ++i) ql[i] = static_cast<uint8_t>(i * 37 + 11);
  for (int i = 0; i < 64; ++i) qh[i] = static_cast<uint8_t>(i * 73 + 5);
  for (int i = 0; i < 16; ++i) sc[i] = static_cast<int8_t>(i * 9 - 70);
  b.append(reinterpret_cast<const char*>(ql), 128);
  b.append(reinterpret_cast<const char*>(qh), 64);
  b.append(reinterpret_cast<const char*>(sc), 16);
  put_f16(b, 0.0625f);
  auto y = dq(GGMLType::Q6_K, 256, b);
  for (int k = 0; k < 256; ++k) {
    const int n = k / 128, r = k % 128, g = r / 32, l = r % 32;
    const uint8_t lb = ql[64 * n + l + 32 * (g & 1)];
    const int lo = g < 2 ? (lb & 15) : (lb >> 4);
    const int hi = (qh[32 * n + l] >> (2 * g)) & 3;
    const int q = (lo | (hi << 4)) - 32;
    const float expect = 0.0625f * sc[8 * n + l / 16 + 2 * g] * static_cast<float>(q);
    INFO("k = " << k);
    CHECK(y[k] == expect);
  }
  // One value by hand: k = 0 -> ql[0] = 11 (lo 11), qh[0] = 5 (bits 0-1 = 1), q = 11 + 16 - 32
  // = -5, scale = sc[0] = -70 -> 0.0625 * -70 * -5 = 21.875.
  CHECK(y[0] == 21.875f);
}

TEST_CASE("Q4_K and Q5_K dequantisation from the block formula", "[gguf][quant]") {
  // Scales / mins of sub-block j (6 bits each, 12 bytes): j < 4: sc = s[j] & 63, m = s[j+4] & 63;
  // j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4.
  // Value k: chunk c = k / 64, r = k % 64, sub-block j = 2c + (r >= 32), l = r % 32;
  // Q4_K: q = nibble (low if r < 32) of qs[32c + l]; Q5_K adds 16 if bit (2c + (r >= 32)) of
  // qh[l] is set. x = d * sc_j * q - dmin * m_j.
  uint8_t s[12], qs[128], qh[32];
  for (int i = 0; i < 12; ++i) s[i] = static_cast<uint8_t>(i * 29 + 200);
  for (int i = 0; i < 128; ++i) qs[i] = static_cast<uint8_t>(i * 53 + 7);
  for (int i = 0; i < 32; ++i) qh[i] = static_cast<uint8_t>(i * 91 + 3);
  auto scale_min = [&](int j, int& sc, int& m) {
    if (j < 4) {
      sc = s[j] & 63;
      m = s[j + 4] & 63;
    } else {
      sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
      m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
  };
  const float d = 0.5f, dmin = 0.25f;
  std::string b4, b5;
  put_f16(b4, d);
  put_f16(b4, dmin);
  b4.append(reinterpret_cast<const char*>(s), 12);
  b5 = b4;
  b4.append(reinterpret_cast<const char*>(qs), 128);
  b5.append(reinterpret_cast<const char*>(qh), 32);
  b5.append(reinterpret_cast<const char*>(qs), 128);
  auto y4 = dq(GGMLType::Q4_K, 256, b4);
  auto y5 = dq(GGMLType::Q5_K, 256, b5);
  for (int k = 0; k < 256; ++k) {
    const int c = k / 64, r = k % 64, hi = r >= 32, j = 2 * c + hi, l = r % 32;
    int sc, m;
    scale_min(j, sc, m);
    const int q4 = hi ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 15);
    const int q5 = q4 + (((qh[l] >> j) & 1) ? 16 : 0);
    INFO("k = " << k);
    CHECK(y4[k] == d * sc * static_cast<float>(q4) - dmin * m);
    CHECK(y5[k] == d * sc * static_cast<float>(q5) - dmin * m);
  }
}

TEST_CASE("the type registry knows every supported type once", "[gguf]") {
  for (const char* n : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}) {
    int count = 0;
    for (const auto& t : all_types()) count += std::string(t.name) == n;
    CHECK(count == 1);
  }
  CHECK(find_type(3)->type_size == 20);
  CHECK(find_type(14)->block_size == 256);
  CHECK(find_type(99) == nullptr);
  REQUIRE_THROWS_WITH(type_traits(99, "ctx"), Contains("ctx") && Contains("99"));
}

TEST_CASE("unpermute_qk inverts llama.cpp's Q/K permutation", "[gguf][permute]") {
  // One head of 4 rows: GGUF stores HF rows [0, 2, 1, 3] (pairs interleaved).
  std::vector<float> gguf_rows{10, 12, 11, 13};
  CHECK(unpermute_qk(gguf_rows, 4, 1, 1) == std::vector<float>{10, 11, 12, 13});
  CHECK(permute_qk(std::vector<float>{10, 11, 12, 13}, 4, 1, 1) == gguf_rows);
  // 3 heads of 8 rows x 5 cols: round trip, and every head only moves its own rows.
  std::vector<float> w(24 * 5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  auto p = permute_qk(w, 24, 5, 3);
  CHECK(unpermute_qk(p, 24, 5, 3) == w);
  CHECK(p != w);
  // hf row h*8 + j*4 + i sits at gguf row h*8 + 2i + j
  for (int h = 0; h < 3; ++h)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) CHECK(p[(h * 8 + 2 * i + j) * 5] == w[(h * 8 + j * 4 + i) * 5]);
  // Tensor form keeps the dtype
  Tensor t = from_vector(w, {24, 5});
  CHECK(unpermute_qk(permute_qk(t, 3), 3).to_vector<float>() == w);
  REQUIRE_THROWS_WITH(unpermute_qk(w, 24, 5, 5), Contains("divisible"));
}

namespace {
std::string header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  std::string b;
  auto put = [&](auto v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(kMagic);
  put(version);
  put(n_tensors);
  put(n_kv);
  return b;
}
}  // namespace

TEST_CASE("corrupt GGUF files give clear errors", "[gguf][errors]") {
  test::TempDir dir("gguf_corrupt");
  const std::string p = dir.file("bad.gguf");
  auto open_bytes = [&](const std::string& bytes) {
    test::write_bytes(p, bytes);
    return GGUFFile::open(p);
  };
  GGUFWriter good;
  good.add_string("general.architecture", "llama");
  good.add_f32_tensor("w", {4, 8}, std::vector<float>(32, 1.0f));
  const std::string ok = good.bytes();
  REQUIRE_NOTHROW(open_bytes(ok));

  SECTION("bad magic") { REQUIRE_THROWS_WITH(open_bytes("GGML" + ok.substr(4)), Contains(p) && Contains("bad magic")); }
  SECTION("empty file") { REQUIRE_THROWS_WITH(open_bytes(""), Contains("not a GGUF file")); }
  SECTION("unsupported version") {
    REQUIRE_THROWS_WITH(open_bytes(header(1, 0, 0)), Contains("unsupported GGUF version 1"));
    REQUIRE_THROWS_WITH(open_bytes(header(0x03000000u, 0, 0)), Contains("big-endian"));
  }
  SECTION("absurd counts") {
    REQUIRE_THROWS_WITH(open_bytes(header(3, 0, 1ull << 60)), Contains("kv count") && Contains("absurd"));
    REQUIRE_THROWS_WITH(open_bytes(header(3, 1ull << 60, 0)), Contains("tensor count") && Contains("absurd"));
  }
  SECTION("string length past EOF") {
    std::string b = header(3, 0, 1);
    uint64_t len = 1000;
    b.append(reinterpret_cast<const char*>(&len), 8);
    b += "abc";
    b.append(40, 'x');  // enough bytes that the kv count itself is plausible
    REQUIRE_THROWS_WITH(open_bytes(b), Contains("metadata key") && Contains("past the end"));
  }
  SECTION("truncated file") {
    // cut one byte into the tensor info (after the 24-byte header and the 45-byte kv)
    REQUIRE_THROWS_WITH(open_bytes(ok.substr(0, 70)), Contains(p) && Contains("truncated") && Contains("tensor name"));
  }
  SECTION("tensor data out of bounds") {
    REQUIRE_THROWS_WITH(open_bytes(ok.substr(0, ok.size() - 8)), Contains("'w'") && Contains("out of bounds"));
  }
  SECTION("unknown tensor type") {
    std::string b = ok;
    // the tensor info ends with u32 type + u64 offset right before the alignment padding
    GGUFWriter w2;
    w2.add_string("general.architecture", "llama");
    w2.add_f32_tensor("w", {4, 8}, std::vector<float>(32, 1.0f));
    std::string bb = w2.bytes();
    const size_t info = bb.find("w\x02\0\0\0", 0, 5);  // name "w", n_dims = 2
    REQUIRE(info != std::string::npos);
    const uint32_t bad = 77;
    std::memcpy(&bb[info + 1 + 4 + 16], &bad, 4);
    REQUIRE_THROWS_WITH(open_bytes(bb), Contains("'w'") && Contains("unknown or unsupported ggml tensor type id 77"));
  }
  SECTION("dims whose byte size overflows") {
    std::string bb = ok;
    const size_t info = bb.find("w\x02\0\0\0", 0, 5);
    REQUIRE(info != std::string::npos);
    const uint64_t huge = 0x7fffffffffffffe0ull;  // ne0 * 4 bytes overflows int64 (found by fuzzing + UBSan)
    std::memcpy(&bb[info + 1 + 4], &huge, 8);
    const uint64_t one = 1;
    std::memcpy(&bb[info + 1 + 4 + 8], &one, 8);
    REQUIRE_THROWS_WITH(open_bytes(bb), Contains("'w'") && Contains("overflow"));
  }
  SECTION("unknown value type") {
    std::string b = header(3, 0, 1);
    uint64_t len = 1;
    b.append(reinterpret_cast<const char*>(&len), 8);
    b += "k";
    uint32_t t = 42;
    b.append(reinterpret_cast<const char*>(&t), 4);
    REQUIRE_THROWS_WITH(open_bytes(b), Contains("'k'") && Contains("unknown value type 42"));
  }
  SECTION("array length absurd") {
    GGUFWriter w2;
    w2.add("a", make_i32_array({1, 2, 3}));
    std::string bb = w2.bytes();
    const uint64_t huge = 1ull << 62;
    std::memcpy(&bb[24 + 8 + 1 + 4 + 4], &huge, 8);  // header, key len, "a", value type, elem type
    REQUIRE_THROWS_WITH(open_bytes(bb), Contains("'a'") && Contains("array length"));
  }
  SECTION("row not a multiple of the block size") {
    GGUFWriter w2;
    REQUIRE_THROWS_WITH(w2.add_tensor("q", {31}, 8, std::string(34, '\0')), Contains("block size"));
  }
}

TEST_CASE("real SmolLM2 GGUF dequantises like gguf-py", "[gguf][real]") {
  if (!std::filesystem::exists(kModel)) {
    WARN("SKIP: " << kModel << " is absent (run scripts/fetch-model.sh)");
    return;
  }
  GGUFFile g = GGUFFile::open(kModel);
  CHECK(g.version() == 3);
  CHECK(g.tensors().size() == 272);
  const auto fixture = nlohmann::json::parse(test::read_bytes("tests/golden/gguf_dequant.json"));
  for (const auto& e : fixture["tensors"]) {
    const std::string name = e["name"];
    INFO(name);
    const TensorInfo& ti = g.tensor_info(name);
    CHECK(std::string(type_traits(ti.type, name).name) == e["type"].get<std::string>());
    CHECK(ti.shape() == e["shape"].get<Shape>());
    std::vector<float> v = g.dequantize(name);
    std::vector<std::pair<std::string, std::vector<float>>> variants{{"gguf_order", v}};
    if (e.contains("n_head")) {
      variants.push_back({"hf_order", unpermute_qk(v, ti.shape()[0], ti.shape()[1], e["n_head"].get<int64_t>())});
    }
    for (const auto& [key, w] : variants) {
      INFO(key);
      const auto& ref = e[key];
      // Each value is computed the same way (f16 scale times a small integer, plus an f16
      // min) in f32 on both sides: samples must match exactly; sums are taken in f64 in a
      // different order, so they get a relative tolerance.
      for (auto it = ref["samples"].begin(); it != ref["samples"].end(); ++it)
        CHECK(w[std::stoul(it.key())] == it.value().get<float>());
      double sum = 0, sum_abs = 0;
      for (float x : w) {
        sum += x;
        sum_abs += std::fabs(x);
      }
      constexpr double kSumRelTol = 1e-9;  // f64 accumulation order only
      CHECK(std::fabs(sum - ref["sum"].get<double>()) <= kSumRelTol * ref["sum_abs"].get<double>());
      CHECK(std::fabs(sum_abs - ref["sum_abs"].get<double>()) <= kSumRelTol * ref["sum_abs"].get<double>());
      const int64_t cols = static_cast<int64_t>(w.size()) / ti.shape()[0];
      for (int r = 0; r < 8 && r < ti.shape()[0]; ++r) {
        double rs = 0;
        for (int64_t c = 0; c < cols; ++c) rs += w[static_cast<size_t>(r * cols + c)];
        CHECK(std::fabs(rs - ref["row_sums_first8"][r].get<double>()) <= 1e-9 * (1 + std::fabs(rs)) * cols);
      }
    }
  }
}
