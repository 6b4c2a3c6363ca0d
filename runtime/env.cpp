#include "runtime/env.h"

#include <mpi.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tensor/error.h"
#ifdef DTR_WITH_CUDA
#include "tensor/cuda/cuda_context.h"
#endif

namespace dtr {
namespace {
bool g_init = false;
bool g_we_initialized_mpi = false;
int g_rank = 0, g_world = 1, g_local_rank = 0, g_local_size = 1, g_threads = 1, g_cuda_device = -1;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  try {
    return std::stoi(v);
  } catch (...) {
    DTR_ERROR("environment variable ", name, "='", v, "' is not an integer");
  }
}
}  // namespace

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
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &g_local_rank);
  MPI_Comm_size(local, &g_local_size);
  MPI_Comm_free(&local);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  int def = std::max(1, cores / std::max(1, g_local_size));
  g_threads = env_int("DTR_NUM_THREADS", env_int("OMP_NUM_THREADS", def));
  DTR_CHECK(g_threads >= 1, "DTR_NUM_THREADS must be >= 1, got ", g_threads);
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
  if (!g_init) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && g_we_initialized_mpi) MPI_Finalize();
  g_init = false;
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
