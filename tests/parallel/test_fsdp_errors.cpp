// fully_shard / replicate bad input: clear errors naming what is wrong.
#include "parallel/ddp.h"
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("fully_shard: bad input") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  SECTION("called twice on one module") {
    auto net = make_net();
    fully_shard(*net->layers->children()[0], mesh);
    CHECK_THROWS_WITH(fully_shard(*net->layers->children()[0], mesh), Catch::Contains("called twice"));
  }
  SECTION("replicate and fully_shard on one module conflict (one state per strategy on the module)") {
    auto a = make_net();
    replicate(*a, mesh);
    CHECK_THROWS_WITH(fully_shard(*a, mesh), Catch::Contains("fully_shard: replicate was already applied to this"));
    auto b = make_net();
    fully_shard(*b, mesh);
    CHECK_THROWS_WITH(replicate(*b, mesh), Catch::Contains("replicate: fully_shard was already applied to this"));
    CHECK(b->composable_state_keys() == std::vector<std::string>{"fully_shard"});
    CHECK(a->composable_state_keys() == std::vector<std::string>{"replicate"});
    // A child of a replicated module: its parameters are in the parent's DDP buckets.
    auto c = make_net();
    replicate(*c, mesh);
    CHECK_THROWS_WITH(fully_shard(*c->layers->children()[0], mesh),
                      Catch::Contains("fully_shard(Block): parameter \"norm.weight\" belongs to a module that "
                                      "replicate was applied to"));
    CHECK(c->layers->children()[0]->composable_state_keys().empty());
  }
  SECTION("a parameter shared between units names both FQNs") {
    auto net = make_net();
    // Tie the head to the embedding table's shape-compatible twin: head.weight [11, 5] = emb.weight.
    net->set_parameter("head.weight", net->emb->weight());
    fully_shard(*net->emb, mesh);
    CHECK_THROWS_WITH(fully_shard(*net, mesh),
                      Catch::Contains("head.weight") && Catch::Contains("\"weight\"") && Catch::Contains("tied"));
  }
  SECTION("tied weights inside one unit are fine") {
    auto net = make_net();
    net->set_parameter("head.weight", net->emb->weight());
    fully_shard(*net, mesh);
    CHECK(net->get_parameter("head.weight").is_same(net->get_parameter("emb.weight")));
  }
  SECTION("unsupported dtype in the mixed precision policy") {
    auto net = make_net();
    FSDPOptions opt;
    opt.mp_policy.param_dtype = DType::i64;
    CHECK_THROWS_WITH(fully_shard(*net, mesh, opt), Catch::Contains("param_dtype") && Catch::Contains("int64"));
    opt.mp_policy.param_dtype = DType::bf16;
    opt.mp_policy.reduce_dtype = DType::i32;
    CHECK_THROWS_WITH(fully_shard(*net, mesh, opt), Catch::Contains("reduce_dtype"));
  }
  SECTION("mesh dims that do not match") {
    auto net = make_net();
    DeviceMesh m3({1, 1, world_size()}, {"a", "b", "c"});
    CHECK_THROWS_WITH(fully_shard(*net, m3), Catch::Contains("1-d") && Catch::Contains("3 dims"));
    CHECK_THROWS_WITH(replicate(*net, m3), Catch::Contains("1-d"));
  }
  SECTION("parameters of one unit with different dtypes") {
    auto net = make_net();
    net->set_parameter("norm.weight", ones({kDim}, TensorOptions(DType::f64)).set_requires_grad(true));
    CHECK_THROWS_WITH(fully_shard(*net, mesh), Catch::Contains("share a dtype") && Catch::Contains("norm.weight"));
  }
  SECTION("negative prefetch depth") {
    auto net = make_net();
    FSDPOptions opt;
    opt.forward_prefetch_depth = -1;
    CHECK_THROWS_WITH(fully_shard(*net, mesh, opt), Catch::Contains("prefetch"));
  }
  SECTION("activation checkpointing after fully_shard") {
    auto net = make_net();
    fully_shard(*net->layers->children()[0], mesh);
    CHECK_THROWS_WITH(checkpoint_module(*net->layers->children()[0]), Catch::Contains("checkpointing first"));
  }
}
