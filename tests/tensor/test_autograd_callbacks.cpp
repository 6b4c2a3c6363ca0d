// End-of-backward callbacks (queue_callback): run once after every node of the outermost
// backward, in queue order, never early inside a checkpoint's nested backward, and never left
// queued for a later backward when a backward throws.
#include <catch2/catch.hpp>

#include "tensor/autograd/checkpoint.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

using namespace dtr;

namespace {
Tensor leaf(std::vector<double> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector<double>(v, {n}).set_requires_grad(true);
}
}  // namespace

TEST_CASE("queue_callback: runs after every node, in queue order, once per backward", "[autograd][callback]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = leaf({3.0});
  std::vector<std::string> log;
  Tensor h = mul(x, 2.0);
  h.register_hook([&](const Tensor&) {
    // Queued while nodes remain: x's and y's gradients are not accumulated yet.
    queue_callback([&] {
      log.push_back("first x.grad=" + std::to_string(x.grad().to_vector<double>()[1]) +
                    " y.grad=" + std::to_string(y.grad().to_vector<double>()[0]));
      queue_callback([&] { log.push_back("queued by a callback"); });
    });
    queue_callback([&] { log.push_back("second"); });
    return Tensor();
  });
  CHECK(current_backward_id() == 0);
  uint64_t id_seen = 0;
  y.register_hook([&](const Tensor&) {
    id_seen = current_backward_id();
    return Tensor();
  });
  add(sum(h), sum(mul(y, y))).backward();
  CHECK(log == std::vector<std::string>{"first x.grad=2.000000 y.grad=6.000000", "second", "queued by a callback"});
  CHECK(id_seen > 0);
  CHECK(current_backward_id() == 0);
  // A second backward over a new graph runs none of the old callbacks and has a new id.
  log.clear();
  uint64_t id2 = 0;
  Tensor z = mul(x, 1.0);
  z.register_hook([&](const Tensor&) {
    id2 = current_backward_id();
    return Tensor();
  });
  sum(z).backward();
  CHECK(log.empty());
  CHECK(id2 > id_seen);
}

TEST_CASE("queue_callback: a checkpoint's nested backward defers to the outermost one", "[autograd][callback]") {
  Tensor w = leaf({0.5, -1.5});
  Tensor x = leaf({2.0, 4.0});
  int ran = 0;
  bool w_grad_final_when_run = false;
  uint64_t inner_id = 0;
  Tensor out = checkpoint(
      [&](const std::vector<Tensor>& in) {
        Tensor h = mul(in[0], w);
        if (checkpoint_recomputing())
          h.register_hook([&](const Tensor&) {
            // Inside the recomputation's nested backward: same outermost id, queued for its end.
            inner_id = current_backward_id();
            queue_callback([&] {
              ++ran;
              w_grad_final_when_run = w.grad().defined() && x.grad().defined();
            });
            return Tensor();
          });
        return h;
      },
      std::vector<Tensor>{x});
  Tensor before = mul(out, 3.0);
  uint64_t outer_id = 0;
  before.register_hook([&](const Tensor&) {
    outer_id = current_backward_id();
    return Tensor();
  });
  sum(before).backward();
  CHECK(ran == 1);
  CHECK(w_grad_final_when_run);
  CHECK(inner_id == outer_id);
  CHECK(w.grad().to_vector<double>() == std::vector<double>{6, 12});
}

TEST_CASE("queue_callback: a backward that throws leaves no callback for the next one", "[autograd][callback]") {
  Tensor x = leaf({1.0, 2.0});
  int ran = 0;
  Tensor h = mul(x, 2.0);
  h.register_hook([&](const Tensor& g) {
    queue_callback([&] { ++ran; });
    return g;
  });
  Tensor y = mul(h, 3.0);
  y.register_hook([&](const Tensor&) -> Tensor {
    // Runs before h's hook (y is later in the graph); queue, then let a later node fail.
    queue_callback([&] { ++ran; });
    return Tensor();
  });
  x.register_hook([](const Tensor&) -> Tensor { DTR_ERROR("boom in backward"); });
  CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("boom in backward"));
  CHECK(ran == 0);
  CHECK(current_backward_id() == 0);
  // The next backward (no failing hook) runs only what it queues itself.
  Tensor x2 = leaf({1.0});
  int ran2 = 0;
  Tensor h2 = mul(x2, 1.0);
  h2.register_hook([&](const Tensor&) {
    queue_callback([&] { ++ran2; });
    return Tensor();
  });
  sum(h2).backward();
  CHECK(ran == 0);
  CHECK(ran2 == 1);
  // A callback that throws drops the rest.
  Tensor x3 = leaf({1.0});
  Tensor h3 = mul(x3, 1.0);
  int after = 0;
  h3.register_hook([&](const Tensor&) {
    queue_callback([] { DTR_ERROR("callback failed"); });
    queue_callback([&] { ++after; });
    return Tensor();
  });
  CHECK_THROWS_WITH(sum(h3).backward(), Catch::Contains("callback failed"));
  CHECK(after == 0);
  sum(mul(x2, 1.0)).backward();
  CHECK(after == 0);
}

TEST_CASE("queue_callback: outside backward is an error", "[autograd][callback]") {
  CHECK_THROWS_WITH(queue_callback([] {}), Catch::Contains("only be queued during backward"));
}
