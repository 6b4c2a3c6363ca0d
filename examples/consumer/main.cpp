// A program built against an installed dtr (examples/consumer/CMakeLists.txt, or
// `pkg-config --cflags --libs dtr`). It touches every library once and checks each result
// against a value computed by hand, so a broken install fails here rather than later:
//   tensor  : y = sum(x @ w) and its gradient dy/dx[i][k] = sum_j w[k][j]
//   runtime : dtr::init / DeviceMesh over the world (1 process when started alone)
//   dtensor : distribute_tensor(Shard(0)) -> full_tensor gives the tensor back
//   models  : the debug Llama's logits have the shape [batch, seq, vocab]
//   train   : a recipe override is parsed into the YAML tree dtr-train reads
// Prints "dtr consumer ok" and exits 0, or names the first check that failed and exits 1.
#include <cmath>
#include <cstdio>

#include "apps/train/recipe.h"
#include "dtensor/api.h"
#include "models/transformer/causal_lm.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/ops.h"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "dtr consumer: FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtr::init(argc, argv);
  {
    // tensor: x [2, 3] of 1.0, w [3, 2] of 0.5 -> sum(x @ w) = 2 * 2 * (3 * 0.5) = 6; dL/dx = 1.0.
    dtr::Tensor x = dtr::ones({2, 3});
    x.set_requires_grad(true);
    dtr::Tensor w = dtr::full({3, 2}, 0.5);
    dtr::Tensor y = dtr::sum(dtr::matmul(x, w));
    y.backward();
    check(std::abs(y.item<double>() - 6.0) < 1e-12, "tensor: sum(x @ w) == 6");
    check(std::abs(dtr::sum(x.grad()).item<double>() - 6.0) < 1e-12, "tensor: sum(dL/dx) == 6");

    // runtime + dtensor: shard a [4, 2] tensor over the world and gather it back.
    dtr::DeviceMesh mesh = dtr::DeviceMesh::world("consumer");
    dtr::Tensor t = dtr::arange(0, 8).reshape({4, 2});
    dtr::Tensor d = dtr::distribute_tensor(t, mesh, {dtr::Shard(0)});
    dtr::Tensor back = dtr::full_tensor(d);
    check(dtr::sum(dtr::abs(dtr::sub(back, t))).item<double>() == 0.0, "dtensor: full_tensor(distribute_tensor(t)) == t");

    // models: the debug Llama on [1, 5] ids.
    dtr::LlamaForCausalLM model(dtr::llama_debug_config());
    dtr::Tensor ids = dtr::zeros({1, 5}, dtr::TensorOptions(dtr::DType::i64));
    dtr::Tensor logits = model.forward(ids);
    check(logits.dim() == 3 && logits.size(0) == 1 && logits.size(1) == 5 &&
              logits.size(2) == model.config().vocab_size,
          "models: logits shape [1, 5, vocab]");

    // train: --set parsing as dtr-train does it.
    YAML::Node root;
    dtr::train::apply_override(root, "optimizer.lr=0.5");
    check(root["optimizer"]["lr"].as<double>() == 0.5, "train: apply_override(optimizer.lr=0.5)");
  }
  const int rank = dtr::rank();
  dtr::finalize();
  if (failures == 0 && rank == 0) std::printf("dtr consumer ok\n");
  return failures == 0 ? 0 : 1;
}
