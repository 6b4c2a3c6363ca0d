#pragma once
// dtr-bench fsdp: per-step bytes communicated and peak memory per rank against their
// theoretical FSDP values, and the exposed communication time fraction, with and without
// prefetch.

namespace dtr::bench {

/// Runs the FSDP benchmark at dp = world size (run under mpirun -np 1/2/4). Options:
///   --layers N (4) --dim N (256) --hidden N (704) --vocab N (2048) --seq N (64) --batch N (8)
///   --steps N (4 timed steps after 1 warm-up) --no-reshard
/// Model: embedding -> N blocks (RMSNorm, Linear dim->hidden, SiLU, Linear hidden->dim,
/// residual) -> RMSNorm -> Linear head; one fully_shard unit per block plus the root.
/// Prints on rank 0, for prefetch depth 1 and 0: step time, bytes/step (measured from the
/// process-group counters, and theoretical), peak memory per rank (allocator) beside the
/// theoretical sharded model state (params + grads + AdamW state) and the unsharded working
/// set, and the exposed communication fraction (time blocked in FSDP waits / step time).
/// Returns 0, or 2 on bad arguments.
int bench_fsdp(int argc, char** argv);

}  // namespace dtr::bench
