#pragma once
// dtr-bench cp-memory: peak memory per rank of one training step (forward + backward of a small
// random Llama, f32) under context parallelism with cp = the world size, so that
// `mpirun -np {1,2,4} dtr-bench cp-memory` shows activation memory per rank falling ~1/cp.
//
// dtr-bench cp-memory [--seq 4096,8192,16384] [--layers 2] [--hidden 128] [--intermediate 256]
//     [--heads 4] [--kv-heads 2] [--vocab 1024] [--threads T]
//   Batch 1, every parameter trainable, loss = causal-LM token mean of this rank's slice (the
//   gradients are not synchronised: memory is the point). Per sequence length, rank 0 prints the
//   local tokens, the maximum over ranks of the peak bytes during the step (memory_stats().peak
//   after reset_peak_memory, counted from the bytes held before the step: parameters and their
//   gradients), the peak total, and the step time; the last line is one JSON object with those
//   rows.
namespace dtr::bench {
int bench_cp_memory(int argc, char** argv);
}  // namespace dtr::bench
