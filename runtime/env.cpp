#include "runtime/env.h"

#include <mpi.h>
#include <omp.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "runtime/watchdog.h"
#include "runtime/work_queue.h"
#include "tensor/env_vars.h"
#include "tensor/error.h"
#ifdef DTR_WITH_CUDA
#include "tensor/cuda/cuda_context.h"
#endif

namespace dtr {
namespace {
bool g_init = false;
bool g_we_initialized_mpi = false;
int g_rank = 0, g_world = 1, g_local_rank = 0, g_local_size = 1, g_threads = 1, g_cuda_device = -1;

/// OMP_NUM_THREADS as OpenMP reads it (the first entry of a nesting list such as "4,2").
int omp_threads(int fallback) {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  DTR_CHECK(end != v && (*end == '\0' || *end == ',') && n >= 1 && n <= 4096, "OMP_NUM_THREADS='", v,
            "': expected a thread count in [1, 4096]");
  return static_cast<int>(n);
}

/// A launcher that started this process as one of several (torchrun's WORLD_SIZE, Open MPI's or
/// a PMI launcher's size) while MPI sees a world of one: N copies would train independently
/// and write into one output directory. Returns "" when there is none, else the message.
std::string foreign_launcher() {
  for (const char* name : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n <= 1) continue;
    const char* rk = std::getenv(std::string(name) == "WORLD_SIZE" ? "RANK" : "OMPI_COMM_WORLD_RANK");
    return detail::cat("this process was started as one of ", n, " (", name, "=", v, rk ? ", rank " : "",
                       rk ? rk : "", ") but MPI sees a world of 1: dtr ranks are started by mpirun / mpiexec / srun "
                       "with the MPI dtr was built with (torchrun-style launchers are not supported); the copies "
                       "would train independently into one output directory");
  }
  return "";
}
}  // namespace

void check_process_environment() {
  for (const auto& w : env::check_environment())
    if (g_rank == 0) std::fprintf(stderr, "dtr: warning: %s\n", w.c_str());
  (void)comm_timeout_s();
  // A file-size limit (ulimit -f) kills with SIGXFSZ by default; ignored, the write fails with
  // EFBIG and the writer reports it like a full disk (checkpoints stay atomic).
  std::signal(SIGXFSZ, SIG_IGN);
}

void init(int& argc, char**& argv) {
  if (g_init) return;
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    g_we_initialized_mpi = true;
    DTR_CHECK(provided >= MPI_THREAD_MULTIPLE,
              "dtr::init: MPI provides thread level ", provided, ", dtr needs MPI_THREAD_MULTIPLE (",
              MPI_THREAD_MULTIPLE, ")");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  check_process_environment();
  if (g_world == 1) {
    const std::string other = foreign_launcher();
    DTR_CHECK(other.empty(), other);
  }
  MPI_Comm local;
  {
    CommDeadline d("MPI_Comm_split_type (dtr::init)", "world");
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local);
  }
  MPI_Comm_rank(local, &g_local_rank);
  MPI_Comm_size(local, &g_local_size);
  MPI_Comm_free(&local);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int def = std::max(1, cores / std::max(1, g_local_size));
  g_threads = static_cast<int>(env::integer("DTR_NUM_THREADS", omp_threads(def)));
  omp_set_num_threads(g_threads);
#ifdef DTR_WITH_CUDA
  // One GPU per local rank. The local rank is the MPI_COMM_TYPE_SHARED split above, which
  // equals OMPI_COMM_WORLD_LOCAL_RANK under mpirun and SLURM_LOCALID under srun (those
  // variables are not read: inside an sbatch job SLURM_LOCALID is 0 for every mpirun rank).
  const int ndev = cuda::device_count();
  if (ndev > 0) {
    g_cuda_device = g_local_rank % ndev;
    cuda::set_device(g_cuda_device);
  }
#endif
  g_init = true;
}

void finalize() {
  if (!g_we_initialized_mpi) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) {
    CommDeadline d("MPI_Finalize", "world");
    MPI_Finalize();
  }
  g_init = false;
  g_we_initialized_mpi = false;
}

bool is_initialized() { return g_init; }
int rank() { return g_rank; }
int world_size() { return g_world; }
int local_rank() { return g_local_rank; }
int local_size() { return g_local_size; }
int num_threads() { return g_threads; }
int cuda_device() { return g_cuda_device; }
void set_num_threads(int n) {
  DTR_CHECK(n >= 1, "set_num_threads: need >= 1 thread, got ", n);
  g_threads = n;
  omp_set_num_threads(n);
}

int64_t all_ranks_max(int64_t v) {
  if (!g_init || g_world == 1) return v;
  int64_t out = v;
  CommDeadline d("all_ranks_max (MPI_Allreduce)", "world");
  MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

void abort_job(const char* msg, int code) {
  std::fprintf(stderr, "[rank %d] %s\n", g_rank, msg);
  std::fflush(stderr);
  if (g_init) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace dtr
