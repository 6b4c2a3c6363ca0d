// nn functional ops against PyTorch (CPU, f64): fixture tests/golden/nn_ops.json written by
// tests/golden/make_nn_fixture.py. Gradients are of sum(out * w), w = cos(0.37 i + 0.1).
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gradcheck.h"

using namespace dtr;
using dtr::testing::max_abs_diff;
using json = nlohmann::json;

namespace {

/// f64 PyTorch vs f64 dtr: only summation order differs.
constexpr double kTol = 1e-12;

const json& fixture() {
  static const json j = [] {
    // ctest runs tests from the source root (as the other golden tests assume).
    std::ifstream f("tests/golden/nn_ops.json");
    REQUIRE(f.good());
    return json::parse(f);
  }();
  return j;
}

Tensor T64(const json& t, bool grad = false) {
  Tensor x = from_vector<double>(t["data"].get<std::vector<double>>(), t["shape"].get<Shape>());
  if (grad) x.set_requires_grad(true);
  return x;
}
Tensor I64(const json& t) { return from_vector<int64_t>(t["data"].get<std::vector<int64_t>>(), t["shape"].get<Shape>()); }

void backprop(const Tensor& out) { sum(mul(out, dtr::testing::golden_grad_weight(out.sizes()))).backward(); }

}  // namespace

TEST_CASE("softmax / log_softmax match PyTorch", "[golden]") {
  for (const char* name : {"softmax_dim1", "softmax_dim0", "log_softmax_dim1", "log_softmax_dim0"}) {
    INFO(name);
    const json& c = fixture()[name];
    Tensor x = T64(c["x"], true);
    const int64_t dim = c["dim"];
    Tensor y = std::string(name).rfind("log", 0) == 0 ? log_softmax(x, dim) : softmax(x, dim);
    CHECK(max_abs_diff(y, T64(c["out"])) < kTol);
    backprop(y);
    CHECK(max_abs_diff(x.grad(), T64(c["dx"])) < kTol);
  }
}

TEST_CASE("rms_norm matches HF LlamaRMSNorm", "[golden]") {
  const json& c = fixture()["rms_norm"];
  Tensor x = T64(c["x"], true), w = T64(c["weight"], true);
  Tensor y = rms_norm(x, w, c["eps"].get<double>());
  CHECK(max_abs_diff(y, T64(c["out"])) < kTol);
  backprop(y);
  CHECK(max_abs_diff(x.grad(), T64(c["dx"])) < kTol);
  CHECK(max_abs_diff(w.grad(), T64(c["dweight"])) < kTol);
}

TEST_CASE("rope matches HF rotate-half", "[golden]") {
  const json& c = fixture()["rope"];
  auto [cos, sin] = rope_tables(c["T"], c["D"], c["theta"], c["pos0"], DType::f32);
  // HF computes the tables in f32: equal up to f32 cos/sin rounding of the library
  CHECK(max_abs_diff(to_dtype(cos, DType::f64), T64(c["cos_f32"])) < 1e-6);
  CHECK(max_abs_diff(to_dtype(sin, DType::f64), T64(c["sin_f32"])) < 1e-6);
  Tensor x = T64(c["x"], true);
  Tensor y = rotary_embedding(x, T64(c["cos_f32"]), T64(c["sin_f32"]));
  CHECK(max_abs_diff(y, T64(c["out"])) < kTol);
  backprop(y);
  CHECK(max_abs_diff(x.grad(), T64(c["dx"])) < kTol);
}

TEST_CASE("sdpa matches PyTorch (GQA, S > T, causal bottom-right and full)", "[golden]") {
  for (const char* name : {"sdpa_causal", "sdpa_full"}) {
    INFO(name);
    const json& c = fixture()[name];
    Tensor q = T64(c["q"], true), k = T64(c["k"], true), v = T64(c["v"], true);
    Tensor y = scaled_dot_product_attention(q, k, v, c["causal"].get<bool>());
    CHECK(max_abs_diff(y, T64(c["out"])) < kTol);
    backprop(y);
    CHECK(max_abs_diff(q.grad(), T64(c["dq"])) < kTol);
    CHECK(max_abs_diff(k.grad(), T64(c["dk"])) < kTol);
    CHECK(max_abs_diff(v.grad(), T64(c["dv"])) < kTol);
  }
}

TEST_CASE("cross_entropy matches PyTorch with ignore_index", "[golden]") {
  const json& c = fixture()["cross_entropy"];
  Tensor x = T64(c["logits"], true);
  Tensor loss = cross_entropy(x, I64(c["targets"]), c["ignore_index"].get<int64_t>());
  CHECK(loss.item<double>() == Approx(c["loss"].get<double>()).epsilon(1e-13));
  loss.backward();
  CHECK(max_abs_diff(x.grad(), T64(c["dlogits"])) < kTol);
}

TEST_CASE("embedding matches PyTorch", "[golden]") {
  const json& c = fixture()["embedding"];
  Tensor w = T64(c["weight"], true);
  Tensor y = embedding(I64(c["ids"]), w);
  CHECK(max_abs_diff(y, T64(c["out"])) == 0.0);
  backprop(y);
  CHECK(max_abs_diff(w.grad(), T64(c["dweight"])) < kTol);
}
