#pragma once
// dtr-bench head: forward + backward of the language-model head and its loss on random hidden
// states, f32: the fused linear_cross_entropy (chunked, no [tokens, vocab] logits) or the
// unfused linear + cross_entropy, so that bench/compare/head.sh can put it beside PyTorch's
// F.linear + F.cross_entropy (bench/compare/torch_head.py) on the same shape and thread count.
//
// dtr-bench head [--tokens 1024] [--hidden 640] [--vocab 262144] [--impl fused|unfused]
//     [--chunk 0] [--steps 2] [--warmup 1] [--threads T] [--seed 1]
//   Input x [tokens, hidden] ~ N(0, 1) and weight [vocab, hidden] ~ N(0, 0.02), both requiring
//   grad (the full fine-tune head; a tied or LoRA-frozen head skips the weight gradient), targets
//   uniform in [0, vocab) with every 8th ignored (-100). One step: loss, backward, gradients
//   dropped. Memory: the allocator's peak and the peak resident set (getrusage) above the
//   resident set once the inputs exist, over the whole run. Prints a line and, as the last line,
//   one JSON object: impl, tokens, hidden, vocab, step_ms_median, loss, peak_alloc_mib,
//   peak_rss_delta_mib, head_gflop_per_step (3 GEMMs of 2 * tokens * hidden * vocab).
namespace dtr::bench {
int bench_head(int argc, char** argv);
}  // namespace dtr::bench
