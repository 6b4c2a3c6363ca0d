// Collectives benchmark, nccl-tests style: for all_reduce, all_gather, reduce_scatter and
// all_to_all over sizes 4 KiB .. 64 MiB (x4 steps; --max-mib 256 for the full sweep), the time
// of raw MPI calls (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall on a
// duplicate of MPI_COMM_WORLD) and of dtr's MpiProcessGroup (issue + Work::wait per call, so the
// hand-off to the communication thread is included) on the same f32 buffers, in one run.
// Bandwidths follow nccl-tests (doc/PERFORMANCE.md): algbw = S / t with S the size in bytes
// (all_reduce: the buffer; all_gather: the gathered output; reduce_scatter: the input;
// all_to_all: the buffer); busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n otherwise.
// Time per call = the slowest rank's mean over the iterations, best of --rounds rounds.
#include "bench/collectives.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/env.h"
#include "runtime/mpi_process_group.h"
#include "tensor/ops.h"

namespace dtr::bench {
namespace {

struct Options {
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = int64_t(64) << 20;
  int rounds = 3;
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
};

double bus_factor(const std::string& op, int n) {
  if (n == 1) return 0.0;
  return op == "all_reduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

/// Mean seconds per call of `fn` on the slowest rank, best of `rounds`.
double time_calls(const std::function<void()>& fn, int iters, int rounds) {
  fn();  // warm-up
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) fn();
    double t = (MPI_Wtime() - t0) / iters, worst = 0;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    best = std::min(best, worst);
  }
  return best;
}

std::string human(int64_t b) {
  char s[32];
  if (b >= (1 << 20)) std::snprintf(s, sizeof s, "%lld MiB", (long long)(b >> 20));
  else std::snprintf(s, sizeof s, "%lld KiB", (long long)(b >> 10));
  return s;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--max-mib") o.max_bytes = std::stoll(next()) << 20;
    else if (a == "--min-kib") o.min_bytes = std::stoll(next()) << 10;
    else if (a == "--rounds") o.rounds = std::stoi(next());
    else if (a == "--ops") {
      o.ops.clear();
      std::stringstream ss(next());
      for (std::string t; std::getline(ss, t, ',');) o.ops.push_back(t);
    } else if (a == "collectives") {
      continue;  // the dtr-bench front end may pass its sub-command through
    } else {
      if (dtr::rank() == 0)
        std::fprintf(stderr, "dtr-bench collectives: unknown argument '%s' (options: --max-mib N --min-kib N "
                             "--ops a,b --rounds N)\n", a.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int bench_collectives(int argc, char** argv) {
  dtr::init(argc, argv);
  Options o;
  if (!parse(argc, argv, o)) return 2;
  const int n = dtr::world_size(), me = dtr::rank();
  auto pg = MpiProcessGroup::world("bench");
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  if (me == 0) {
    std::printf("# dtr-bench collectives: %d ranks, float32, dtr = MpiProcessGroup (issue + wait per call), "
                "MPI = raw blocking call, same buffers\n", n);
    std::printf("%-15s %10s | %10s %8s %8s | %10s %8s %8s | %6s\n", "op", "size", "MPI us", "algbw", "busbw",
                "dtr us", "algbw", "busbw", "dtr/MPI");
    std::printf("%-15s %10s | %10s %8s %8s | %10s %8s %8s | %6s\n", "", "", "", "GB/s", "GB/s", "", "GB/s", "GB/s", "");
  }
  for (const std::string& op : o.ops) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
      const int64_t count = std::max<int64_t>(n, (bytes / 4) / n * n);  // f32 elements, divisible by n
      const int64_t S = count * 4;
      const int iters = static_cast<int>(std::clamp<int64_t>((int64_t(256) << 20) / S, 3, 200));
      Tensor big = zeros({count}), small = zeros({count / n}), big2 = zeros({count});
      const int c = static_cast<int>(count), cs = static_cast<int>(count / n);
      std::function<void()> mpi_fn, dtr_fn;
      if (op == "all_reduce") {
        mpi_fn = [&] { MPI_Allreduce(MPI_IN_PLACE, big.data_ptr(), c, MPI_FLOAT, MPI_SUM, raw); };
        dtr_fn = [&] { pg->all_reduce(big)->wait(); };
      } else if (op == "all_gather") {
        mpi_fn = [&] { MPI_Allgather(small.data_ptr(), cs, MPI_FLOAT, big.data_ptr(), cs, MPI_FLOAT, raw); };
        dtr_fn = [&] { pg->all_gather(big, small)->wait(); };
      } else if (op == "reduce_scatter") {
        mpi_fn = [&] { MPI_Reduce_scatter_block(big.data_ptr(), small.data_ptr(), cs, MPI_FLOAT, MPI_SUM, raw); };
        dtr_fn = [&] { pg->reduce_scatter(small, big)->wait(); };
      } else if (op == "all_to_all") {
        mpi_fn = [&] { MPI_Alltoall(big.data_ptr(), cs, MPI_FLOAT, big2.data_ptr(), cs, MPI_FLOAT, raw); };
        dtr_fn = [&] { pg->all_to_all(big2, big)->wait(); };
      } else {
        if (me == 0) std::fprintf(stderr, "dtr-bench collectives: unknown op '%s'\n", op.c_str());
        return 2;
      }
      // Interleave the two implementations round by round so drift affects both alike.
      double t_mpi = 1e30, t_dtr = 1e30;
      for (int r = 0; r < o.rounds; ++r) {
        t_mpi = std::min(t_mpi, time_calls(mpi_fn, iters, 1));
        t_dtr = std::min(t_dtr, time_calls(dtr_fn, iters, 1));
      }
      if (me == 0) {
        const double f = bus_factor(op, n);
        const double a_mpi = S / t_mpi / 1e9, a_dtr = S / t_dtr / 1e9;
        std::printf("%-15s %10s | %10.1f %8.2f %8.2f | %10.1f %8.2f %8.2f | %6.2f\n", op.c_str(), human(S).c_str(),
                    t_mpi * 1e6, a_mpi, a_mpi * f, t_dtr * 1e6, a_dtr, a_dtr * f, t_mpi / t_dtr);
        std::fflush(stdout);
      }
    }
  }
  MPI_Comm_free(&raw);
  return 0;
}

}  // namespace dtr::bench
