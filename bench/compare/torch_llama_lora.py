#!/usr/bin/env python3
"""PyTorch reference for `dtr-bench train-step`: the same Llama (+ LoRA) training step.

Model (the formula of dtr's models/llama, i.e. transformers' LlamaForCausalLM):
  embed_tokens -> L x [x + attn(rmsnorm(x)); h + mlp(rmsnorm(h))] -> rmsnorm -> lm_head
  attention: q/k/v/o Linear (no bias), RoPE (HF rotate-half layout, theta 10000 unless given),
             grouped-query heads, F.scaled_dot_product_attention(is_causal=True)
             (GQA: enable_gqa=True by default, --gqa repeat = HF's repeat_kv + plain sdpa)
  mlp:       down(silu(gate(x)) * up(x))
  lm_head:   tied to embed_tokens (the same Parameter)
  loss:      cross_entropy(logits, labels), mean over batch x seq; ids and labels uniform random
             (separate draws, labels used as given: no shift, like dtr-bench train-step)
LoRA: written here (not peft): y = x W^T + (alpha / r) * B(A(x)), A [r, in] Kaiming-uniform
(a = sqrt 5, PEFT's default), B [out, r] zeros, no dropout, on q,k,v,o,gate,up,down; every
other parameter frozen. --full-ft: no LoRA, every parameter trainable.
Init: Linear / Embedding weights ~ N(0, 0.02), norms 1 (HF _init_weights), seed --seed.
Optimizer: torch.optim.AdamW(lr 1e-4, weight decay 0.01; fused=True where the installed torch
supports it on CPU, else the default implementation: --adamw picks).

--fsdp (under torchrun, gloo): FSDP2 (torch.distributed.fsdp.fully_shard) per decoder layer and
on the root; --ddp: DistributedDataParallel instead. Each rank trains on its own --batch
sequences (tokens/s counts all ranks).

Output: a phase table, then as the LAST stdout line one JSON object with the fields of
`dtr-bench train-step` (step_ms_median, tokens_per_s, model_flops_per_step, peak_rss_mib,
phases {forward_ms, backward_ms, optimizer_ms, comm_exposed_ms}) plus params_total,
params_trainable, initial_loss, ln_vocab, torch_version, threads, world_size.

Model FLOPs per step (the ONE formula of bench/compare, also used by run.sh for both
implementations; see model_flops()):
  T = tokens per step (batch x seq x ranks), N = weights of every matmul (q,k,v,o,gate,up,down
  of all layers + lm_head [vocab, hidden]; the embedding lookup and norms are not matmuls),
  Nl = LoRA adapter weights, Fa = 4 x L x batch x ranks x seq^2 x heads x head_dim
  (QK^T and PV forward, full square: causal masking not discounted).
  LoRA:    2NT (forward) + 2NT (input gradients) + 6 Nl T + 3 Fa (forward + 2x backward)
  full FT: 6NT + 3 Fa
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count())
    p.add_argument("--full-ft", action="store_true")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard under torchrun (gloo)")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel under torchrun (gloo)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--rope-theta", type=float, default=100000.0)
    p.add_argument("--rms-eps", type=float, default=1e-5)
    p.add_argument("--gqa", choices=["native", "repeat"], default="native")
    p.add_argument("--adamw", choices=["auto", "fused", "foreach", "loop"], default="auto")
    return p.parse_args(argv)


def matmul_weights(a):
    """N of the FLOP formula: weights of every matmul (all layers' projections + lm_head)."""
    hd = a.hidden // a.heads
    q, kv = a.heads * hd, a.kv_heads * hd
    per_layer = a.hidden * q + 2 * a.hidden * kv + q * a.hidden + 3 * a.hidden * a.intermediate
    return a.layers * per_layer + a.vocab * a.hidden


def lora_weights(a):
    """Nl: adapter weights of LoRA on q,k,v,o,gate,up,down (r x (in + out) each)."""
    hd = a.hidden // a.heads
    q, kv, h, i, r = a.heads * hd, a.kv_heads * hd, a.hidden, a.intermediate, a.lora_rank
    per_layer = r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))
    return a.layers * per_layer


def model_flops(a, world=1):
    """Model FLOPs of one training step (formula in the module docstring)."""
    T = a.batch * a.seq * world
    N = matmul_weights(a)
    fa = 4 * a.layers * a.batch * world * a.seq * a.seq * a.heads * (a.hidden // a.heads)
    if a.full_ft:
        return 6 * N * T + 3 * fa
    return 4 * N * T + 6 * lora_weights(a) * T + 3 * fa


def build(a, torch):
    nn, F = torch.nn, torch.nn.functional
    hd = a.hidden // a.heads

    class LoRALinear(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.base = base
            self.lora_A = nn.Linear(base.in_features, r, bias=False)  # Kaiming-uniform(a=sqrt 5)
            self.lora_B = nn.Linear(r, base.out_features, bias=False)
            nn.init.zeros_(self.lora_B.weight)
            self.scale = alpha / r

        def forward(self, x):
            return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale

    def lin(i, o):
        l = nn.Linear(i, o, bias=False)
        return l if a.full_ft else LoRALinear(l, a.lora_rank, a.lora_alpha)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = lin(a.hidden, a.heads * hd), lin(a.hidden, a.kv_heads * hd)
            self.v_proj, self.o_proj = lin(a.hidden, a.kv_heads * hd), lin(a.heads * hd, a.hidden)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q = self.q_proj(x).view(B, T, -1, hd).transpose(1, 2)
            k = self.k_proj(x).view(B, T, -1, hd).transpose(1, 2)
            v = self.v_proj(x).view(B, T, -1, hd).transpose(1, 2)

            def rot(t):  # HF rotate_half
                t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
                return torch.cat((-t2, t1), dim=-1)

            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            if a.gqa == "repeat":
                rep = a.heads // a.kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = lin(a.hidden, a.intermediate), lin(a.hidden, a.intermediate)
            self.down_proj = lin(a.intermediate, a.hidden)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.RMSNorm(a.hidden, eps=a.rms_eps)
            self.self_attn = Attention()
            self.post_attention_layernorm = nn.RMSNorm(a.hidden, eps=a.rms_eps)
            self.mlp = MLP()

        def forward(self, x, cos, sin):
            h = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return h + self.mlp(self.post_attention_layernorm(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(a.layers))
            self.norm = nn.RMSNorm(a.hidden, eps=a.rms_eps)
            self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
            self.lm_head.weight = self.embed_tokens.weight  # tied
            inv = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            ang = torch.outer(torch.arange(a.seq, dtype=torch.float32), inv)
            emb = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)

        def forward(self, ids, labels):
            h = self.embed_tokens(ids)
            for layer in self.layers:
                h = layer(h, self.cos, self.sin)
            logits = self.lm_head(self.norm(h))
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))

    model = Llama()
    with torch.no_grad():  # HF _init_weights; LoRA A keeps its Kaiming init, B zeros
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif "lora_" not in name:
                p.normal_(0.0, 0.02)
    if not a.full_ft:
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)
    return model


def make_optimizer(a, torch, params):
    kw = dict(lr=1e-4, weight_decay=0.01)
    if a.adamw == "fused" or a.adamw == "auto":
        try:
            opt = torch.optim.AdamW(params, fused=True, **kw)
            return opt, "fused"
        except (RuntimeError, TypeError, ValueError):
            if a.adamw == "fused":
                raise
    if a.adamw == "foreach" or a.adamw == "auto":
        return torch.optim.AdamW(params, foreach=True, **kw), "foreach"
    return torch.optim.AdamW(params, foreach=False, **kw), "loop"


def timed_steps(a, loss_fn, opt, barrier=None):
    """a.warmup + a.steps training steps: loss_fn() (forward + loss), backward, opt.step() +
    zero_grad. Returns the forward, backward, optimizer and step seconds of the timed steps and
    the loss of every step. barrier(): called before each step (distributed runs)."""
    fwd, bwd, optm, steps, losses = [], [], [], [], []
    for s in range(a.warmup + a.steps):
        if barrier:
            barrier()
        t0 = time.perf_counter()
        loss = loss_fn()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        losses.append(loss.item())  # inside the step time, as dtr's "other" phase
        t4 = time.perf_counter()
        if s >= a.warmup:
            fwd.append(t1 - t0), bwd.append(t2 - t1), optm.append(t3 - t2), steps.append(t4 - t0)
    return fwd, bwd, optm, steps, losses


def main():
    a = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    dist_mode = "fsdp2" if a.fsdp else ("ddp" if a.ddp else None)
    world, rank = 1, 0
    if dist_mode:
        dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(a.seed)
    model = build(a, torch)
    params_total = sum(p.numel() for p in model.parameters())  # tied weight once
    params_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if dist_mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif dist_mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt, adamw_impl = make_optimizer(a, torch, [p for p in model.parameters() if p.requires_grad])

    g = torch.Generator().manual_seed(a.seed + 1 + rank)  # each rank its own batch
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    labels = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)

    fwd, bwd, optm, steps, losses = timed_steps(a, lambda: model(ids, labels), opt,
                                                dist.barrier if dist_mode else None)

    def med(xs):
        return statistics.median(xs) * 1e3

    step_ms, f_ms, b_ms, o_ms = med(steps), med(fwd), med(bwd), med(optm)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    if dist_mode:  # the slowest rank's step, the largest rank's memory
        t = torch.tensor([step_ms, f_ms, b_ms, o_ms, rss_mib], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        step_ms, f_ms, b_ms, o_ms, rss_mib = t.tolist()
    tokens = a.batch * a.seq * world
    flops = model_flops(a, world)
    out = {
        "impl": "pytorch",
        "torch_version": torch.__version__,
        "mode": "full_ft" if a.full_ft else "lora",
        "dist": dist_mode or "none",
        "world_size": world,
        "threads": a.threads,
        "adamw": adamw_impl,
        "gqa": a.gqa,
        "step_ms_median": step_ms,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / (step_ms / 1e3),
        "model_flops_per_step": flops,
        "model_gflops_per_s": flops / (step_ms / 1e3) * 1e-9,
        "peak_rss_mib": rss_mib,
        "params_total": params_total,
        "params_trainable": params_trainable,
        "initial_loss": losses[0],
        "final_loss": losses[-1],
        "ln_vocab": math.log(a.vocab),
        "phases": {"forward_ms": f_ms, "backward_ms": b_ms, "optimizer_ms": o_ms,
                   # FSDP2 / DDP overlap their collectives with compute inside forward and
                   # backward; the exposed share is not separated here.
                   "comm_exposed_ms": None if dist_mode else 0.0},
    }
    if rank == 0:
        print(f"pytorch {torch.__version__} train step: layers {a.layers} hidden {a.hidden} seq {a.seq} "
              f"batch {a.batch} x {world} rank(s), {out['mode']}, threads {a.threads}, AdamW {adamw_impl}")
        print(f"params {params_total} (trainable {params_trainable}), loss {losses[0]:.4f} -> {losses[-1]:.4f} "
              f"(ln vocab {math.log(a.vocab):.4f})")
        print(f"{'phase':<12} {'ms (median)':>12} {'share':>7}")
        for name, v in (("forward", f_ms), ("backward", b_ms), ("optimizer", o_ms)):
            print(f"{name:<12} {v:>12.1f} {100 * v / step_ms:>6.1f}%")
        print(f"{'step':<12} {step_ms:>12.1f}   tokens/s {out['tokens_per_s']:.0f}  peak RSS {rss_mib:.0f} MiB")
        print(json.dumps(out), flush=True)
    if dist_mode:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
