"""The PyTorch side of bench/compare/head.sh: the language-model head and its loss as PyTorch
users write it, F.cross_entropy(F.linear(x, w), targets, ignore_index=-100) in f32, forward +
backward, on `--threads` threads, with the inputs of `dtr-bench head` (x [tokens, hidden] ~ N(0, 1),
w [vocab, hidden] ~ N(0, 0.02), both requiring grad; targets uniform, every 8th ignored). Peak
memory: getrusage's max RSS above the RSS once the inputs exist (PyTorch's CPU allocator keeps
no peak counter). Prints one JSON line with the fields of dtr-bench head (impl = "torch").
"""
import argparse
import json
import resource

import torch
import torch.nn.functional as F
from step_timing import median_step_seconds


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=640)
    p.add_argument("--vocab", type=int, default=262144)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    x = torch.randn(a.tokens, a.hidden, requires_grad=True)
    w = (torch.randn(a.vocab, a.hidden) * 0.02).requires_grad_(True)
    t = torch.randint(0, a.vocab, (a.tokens,))
    t[7::8] = -100
    rss0 = rss_mib()
    loss = 0.0

    def step():
        nonlocal loss
        l = F.cross_entropy(F.linear(x, w), t, ignore_index=-100)
        l.backward()
        loss = l.item()
        x.grad = None
        w.grad = None

    s = median_step_seconds(step, a.warmup, a.steps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"impl": "torch", "threads": torch.get_num_threads(), "tokens": a.tokens, "hidden": a.hidden,
                      "vocab": a.vocab, "step_ms_median": s * 1e3, "loss": loss, "peak_rss_delta_mib": peak - rss0,
                      "head_gflop_per_step": 6e-9 * a.tokens * a.hidden * a.vocab}))


if __name__ == "__main__":
    main()
