// KV cache: feeding a prompt and then one token at a time with the cache gives the same logits
// as recomputing the whole sequence (f32; only summation order differs).
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "models/transformer/causal_lm.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/random.h"

using namespace dtr;

TEST_CASE("incremental decoding with the KV cache equals full recomputation", "[llama][kv_cache]") {
  manual_seed(3);
  LlamaForCausalLM m(llama_debug_config());
  m.eval();
  NoGradGuard ng;
  Tensor ids = to_dtype(mul(rand({2, 9}), 127.0), DType::i64);
  Tensor full = m.call(ids);  // [2, 9, V]
  enable_kv_cache(m, true);
  Tensor first = m.call(narrow(ids, 1, 0, 5).contiguous());
  CHECK(dtr::testing::max_abs_diff(first, narrow(full, 1, 0, 5)) < 1e-5);
  for (int64_t t = 5; t < 9; ++t) {
    Tensor step = m.call(narrow(ids, 1, t, 1).contiguous());
    CHECK(dtr::testing::max_abs_diff(step, narrow(full, 1, t, 1)) < 1e-5);
  }
  enable_kv_cache(m, false);
  CHECK(dtr::testing::max_abs_diff(m.call(ids), full) == 0);
}
