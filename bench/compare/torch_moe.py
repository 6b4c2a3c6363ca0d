"""The PyTorch side of bench/compare/moe.sh: transformers' Qwen3MoeSparseMoeBlock (router +
grouped experts, norm_topk_prob) on the shape `dtr-bench moe` uses, forward + backward of
sum(out * w), f32, on `--threads` threads. Prints one JSON line with the fields of dtr-bench moe
(impl = "torch-<experts implementation>"). The experts implementation is transformers'
`experts_implementation` (eager: a loop over the hit experts; grouped_mm / batched_mm where
this torch has them).
"""
import argparse
import json

import torch
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from step_timing import median_step_seconds


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--impl", default="eager")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    cfg = Qwen3MoeConfig(hidden_size=a.hidden, moe_intermediate_size=a.intermediate, num_experts=a.experts,
                         num_experts_per_tok=a.top_k, norm_topk_prob=True, hidden_act="silu")
    cfg._experts_implementation = a.impl
    block = Qwen3MoeSparseMoeBlock(cfg).float()
    with torch.no_grad():
        block.gate.weight.uniform_(-0.05, 0.05)
        b1, b2 = a.hidden ** -0.5, a.intermediate ** -0.5
        block.experts.gate_up_proj.uniform_(-b1, b1)
        block.experts.down_proj.uniform_(-b2, b2)
    x = torch.randn(1, a.tokens, a.hidden, requires_grad=True)
    w = torch.randn(1, a.tokens, a.hidden)

    def step():
        loss = (block(x) * w).sum()
        loss.backward()
        block.zero_grad(set_to_none=True)
        x.grad = None

    s = median_step_seconds(step, a.warmup, a.steps)
    gflop = 18e-9 * a.tokens * a.top_k * a.hidden * a.intermediate
    print(json.dumps({"impl": "torch-" + a.impl, "threads": torch.get_num_threads(), "tokens": a.tokens,
                      "step_ms_median": s * 1e3, "tokens_per_s": a.tokens / s,
                      "expert_gemm_gflop_per_step": gflop, "expert_gemm_gflops": gflop / s}))


if __name__ == "__main__":
    main()
