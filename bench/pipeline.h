#pragma once
// dtr-bench pipeline (under mpirun; pp = world size): the bubble fraction each schedule
// measures beside its theory, and each stage's peak activation memory, GPipe vs 1F1B vs
// interleaved 1F1B, on a random-init Llama (full fine-tune, f32).
//
// mpirun -np P dtr-bench pipeline [--layers 8] [--hidden 256] [--intermediate 512] [--heads 8]
//     [--kv-heads 4] [--vocab 1024] [--seq 128] [--rows 2] [--micro 4,8,16] [--steps 3]
//     [--threads T]
//   Per schedule and micro-batch count m (rows rows each): `steps` timed optimizer steps after
//   one warm-up. Measured bubble = 1 - sum over ranks of the time inside stage forwards and
//   backwards / (P x the slowest rank's step time), median over steps; theory (P - 1) / (m + P - 1)
//   for GPipe and 1F1B, (P - 1) / (v m + P - 1) for interleaved (v = 2 stages per rank).
//   Peak memory per stage: the largest live bytes during the step above those held before it
//   (parameters, gradients and optimizer state excluded), per pp rank.
//   Prints a table and, as the last line, one JSON object with every row.
namespace dtr::bench {
int bench_pipeline(int argc, char** argv);
}  // namespace dtr::bench
