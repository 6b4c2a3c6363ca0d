// safetensors: bit-exact round trips for every dtype, sharded checkpoints, corrupt files.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <random>

#include "models/formats/safetensors.h"
#include "models/formats/sharded_checkpoint.h"
#include "models/test_util.h"

using namespace dtr;
using namespace dtr::safetensors;
using Catch::Matchers::Contains;

namespace {

// A tensor of `dtype` filled with random bytes (every bit pattern, NaN payloads included);
// bool gets 0/1.
Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = empty(shape, TensorOptions(dtype));
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = dtype == DType::bool_ ? rng() % 2 : static_cast<uint8_t>(rng());
  return t;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file from a header JSON and a data section.
std::string make_file(const std::string& header, const std::string& data) { return u64le(header.size()) + header + data; }

}  // namespace

TEST_CASE("safetensors round trip is bit-exact for every dtype", "[safetensors]") {
  test::TempDir dir("st_roundtrip");
  TensorMap in;
  const DType dtypes[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8, DType::bool_};
  uint32_t seed = 1;
  for (DType d : dtypes) {
    in[std::string("t_") + dtype_name(d)] = random_tensor({3, 5, 7}, d, seed++);
    in[std::string("s_") + dtype_name(d)] = random_tensor({}, d, seed++);  // 0-d
  }
  in["empty"] = random_tensor({0, 4}, DType::f32, 99);
  in["odd_u8"] = random_tensor({3}, DType::u8, 100);  // 3 bytes: later tensors must still be aligned
  const std::string path = dir.file("x.safetensors");
  save_file(in, path, {{"format", "pt"}});

  // header padded to 8 bytes, no temp file left behind
  const std::string bytes = test::read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path), {}) == 1);

  for (LoadMode mode : {LoadMode::copy, LoadMode::view}) {
    TensorMap out = load_file(path, mode);
    REQUIRE(out.size() == in.size());
    for (const auto& [name, t] : in) {
      INFO(name);
      REQUIRE(out.count(name));
      CHECK(bit_equal(t, out.at(name)));
    }
  }
  auto f = SafetensorsFile::open(path);
  CHECK(f.metadata().at("format") == "pt");
  // Every tensor starts at a multiple of its item size (larger items are written first).
  for (const auto& e : f.header().tensors) CHECK((f.header().data_start + e.begin) % itemsize(e.dtype) == 0);
}

TEST_CASE("a view keeps the mapped file alive", "[safetensors]") {
  test::TempDir dir("st_view");
  TensorMap in{{"w", random_tensor({64}, DType::f32, 7)}};
  save_file(in, dir.file("v.safetensors"));
  Tensor v;
  {
    auto f = SafetensorsFile::open(dir.file("v.safetensors"));
    v = f.get("w", LoadMode::view);
  }
  std::filesystem::remove(dir.file("v.safetensors"));
  CHECK(bit_equal(v, in["w"]));
}

TEST_CASE("sharded checkpoint with index round trip", "[safetensors]") {
  test::TempDir dir("st_sharded");
  TensorMap in;
  for (int i = 0; i < 7; ++i) in["model.layers." + std::to_string(i) + ".w"] = random_tensor({16, 16}, DType::bf16, 10 + i);
  in["model.embed_tokens.weight"] = random_tensor({32, 16}, DType::f32, 3);
  // 16*16*2 = 512 bytes per layer; a 1200-byte limit gives several shards.
  auto written = save_sharded(in, dir.path.string(), 1200);
  REQUIRE(written.size() > 2);
  CHECK(written.back() == dir.file("model.safetensors.index.json"));
  const ShardIndex idx = read_index(written.back());
  CHECK(idx.weight_map.size() == in.size());
  uint64_t total = 0;
  for (const auto& kv : in) total += kv.second.nbytes();
  CHECK(idx.total_size == total);
  // name order: the 2048-byte embedding fills shard 1 alone
  CHECK(idx.weight_map.at("model.embed_tokens.weight").find("model-00001-of-0000") == 0);
  CHECK(idx.weight_map.at("model.layers.0.w").find("model-00002-of-0000") == 0);

  for (const std::string& p : {dir.path.string(), written.back()}) {
    TensorMap out = load_checkpoint(p);
    REQUIRE(out.size() == in.size());
    for (const auto& [name, t] : in) CHECK(bit_equal(t, out.at(name)));
  }
  // an index that names a tensor its shard lacks
  ShardIndex bad = idx;
  bad.weight_map["ghost"] = idx.weight_map.begin()->second;
  write_index(bad, dir.file("model.safetensors.index.json"));
  REQUIRE_THROWS_WITH(load_checkpoint(dir.path.string()), Contains("ghost") && Contains("lacks"));
}

TEST_CASE("single-shard checkpoint is model.safetensors", "[safetensors]") {
  test::TempDir dir("st_single");
  TensorMap in{{"a", random_tensor({4}, DType::i64, 1)}};
  auto written = save_sharded(in, dir.path.string());
  REQUIRE(written.size() == 1);
  CHECK(written[0] == dir.file("model.safetensors"));
  CHECK(bit_equal(load_checkpoint(dir.path.string()).at("a"), in["a"]));
}

TEST_CASE("corrupt safetensors files give clear errors", "[safetensors][errors]") {
  test::TempDir dir("st_corrupt");
  const std::string p = dir.file("bad.safetensors");
  auto open_err = [&](const std::string& bytes) {
    test::write_bytes(p, bytes);
    return SafetensorsFile::open(p);
  };
  const std::string good_data(16, '\x01');

  SECTION("shorter than the length prefix") {
    REQUIRE_THROWS_WITH(open_err("abc"), Contains(p) && Contains("8-byte header length"));
  }
  SECTION("header length past end of file") {
    REQUIRE_THROWS_WITH(open_err(u64le(1000) + "{}"), Contains(p) && Contains("runs past the end of the file"));
  }
  SECTION("absurd header length") {
    REQUIRE_THROWS_WITH(open_err(u64le(~0ull) + "{}"), Contains("exceeds the limit"));
  }
  SECTION("JSON error names the offset") {
    REQUIRE_THROWS_WITH(open_err(make_file("{\"a\": [1,", "")), Contains(p) && Contains("JSON error at file offset"));
  }
  SECTION("header not an object") {
    REQUIRE_THROWS_WITH(open_err(make_file("[1, 2]", "")), Contains("not a JSON object"));
  }
  SECTION("unknown dtype") {
    REQUIRE_THROWS_WITH(
        open_err(make_file(R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", good_data)),
        Contains(p) && Contains("'w'") && Contains("F8_E4M3"));
  }
  SECTION("offsets out of bounds") {
    REQUIRE_THROWS_WITH(open_err(make_file(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", good_data)),
                        Contains("'w'") && Contains("past the end of the file"));
  }
  SECTION("shape does not match byte length") {
    REQUIRE_THROWS_WITH(open_err(make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", good_data)),
                        Contains("'w'") && Contains("hold 16 bytes"));
  }
  SECTION("overlapping tensors") {
    REQUIRE_THROWS_WITH(open_err(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                           good_data)),
                        Contains("overlap") && Contains("'a'") && Contains("'b'"));
  }
  SECTION("reversed offsets") {
    REQUIRE_THROWS_WITH(open_err(make_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", good_data)),
                        Contains("reversed"));
  }
  SECTION("overflowing shape") {
    REQUIRE_THROWS_WITH(open_err(make_file(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                                           good_data)),
                        Contains("'w'") && Contains("overflow"));
  }
  SECTION("negative dim") {
    REQUIRE_THROWS_WITH(open_err(make_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", good_data)),
                        Contains("non-negative"));
  }
  SECTION("missing data_offsets") {
    REQUIRE_THROWS_WITH(open_err(make_file(R"({"w":{"dtype":"F32","shape":[1]}})", good_data)),
                        Contains("data_offsets"));
  }
  SECTION("metadata must be strings") {
    REQUIRE_THROWS_WITH(open_err(make_file(R"({"__metadata__":{"a":1}})", "")), Contains("__metadata__"));
  }
  SECTION("missing file") {
    REQUIRE_THROWS_WITH(SafetensorsFile::open(dir.file("nope.safetensors")), Contains("nope.safetensors"));
  }
}

TEST_CASE("misaligned data is copied, not viewed", "[safetensors]") {
  test::TempDir dir("st_misaligned");
  // Header padded so that the data section starts at an odd... offset 8 + 60 = 68; tensor at 1.
  std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  std::string data = "\x07";
  float v[2] = {1.5f, -2.25f};
  data.append(reinterpret_cast<const char*>(v), 8);
  test::write_bytes(dir.file("m.safetensors"), make_file(header, data));
  auto f = SafetensorsFile::open(dir.file("m.safetensors"));
  Tensor w = f.get("w", LoadMode::view);
  REQUIRE(w.numel() == 2);
  CHECK(reinterpret_cast<uintptr_t>(w.data_ptr()) % 4 == 0);
  CHECK(w.data<float>()[0] == 1.5f);
  CHECK(w.data<float>()[1] == -2.25f);
}

TEST_CASE("writing never leaves a half file", "[safetensors]") {
  test::TempDir dir("st_atomic");
  TensorMap in{{"a", random_tensor({4}, DType::f32, 1)}, {"b", Tensor()}};
  REQUIRE_THROWS_WITH(save_file(in, dir.file("x.safetensors")), Contains("'b'"));
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path), {}) == 0);
}
