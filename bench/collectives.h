#pragma once
// dtr-bench collectives: nccl-tests style bandwidth of dtr's ProcessGroup beside raw MPI.

namespace dtr::bench {

/// Runs the collectives benchmark (call under mpirun; initialises dtr if needed). Options:
///   --max-mib N   largest size in MiB (default 64; up to 256 for the full sweep)
///   --min-kib N   smallest size in KiB (default 4)
///   --ops a,b     subset of all_reduce,all_gather,reduce_scatter,all_to_all
///   --rounds N    timed rounds per size and implementation, best kept (default 3)
/// Prints on rank 0 one table row per (op, size): time, algbw, busbw of raw MPI and of dtr and
/// the ratio dtr/MPI. Returns 0, or 2 on bad arguments.
int bench_collectives(int argc, char** argv);

}  // namespace dtr::bench
