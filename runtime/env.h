#pragma once
// Process environment: MPI initialisation, rank / world / local rank, CPU threads per rank.
//
// Environment variables of the runtime (every DTR_* variable is parsed by init, see
// tensor/env_vars.h for the table):
//   DTR_NUM_THREADS      CPU threads per rank (else OMP_NUM_THREADS, else cores / local ranks)
//   DTR_COMM_TIMEOUT_S   seconds a Work::wait (and a group's drain at destruction), and every
//                        blocking MPI call dtr makes outside a process group (all_ranks_max,
//                        communicator creation, MPI_Finalize; runtime/watchdog.h), may block
//                        before the rank prints "[rank N] collective X on group G timed out
//                        after T s" and aborts the job with MPI_Abort (default 600)
//   DTR_COMM_DEBUG=1     every collective first compares (kind, numel, dtype) across the
//                        group's ranks and raises a clear dtr::Error on all ranks on mismatch
//   DTR_BACKEND          mpi | nccl: collective backend of CUDA meshes (default nccl when every
//                        local rank has its own GPU, else mpi; see collective_backend())
// A rank that dies under mpirun makes Open MPI abort the whole job by itself; the timeout
// covers a rank that hangs or is stopped (see runtime/work_queue.h, runtime/watchdog.h).
#include <cstdint>

namespace dtr {

/// Initialises dtr: MPI with MPI_THREAD_MULTIPLE when launched by mpirun/srun (world size 1
/// without a launcher), the local (shared-memory) rank, the CPU threads per rank
/// (DTR_NUM_THREADS, else OMP_NUM_THREADS, else cores / local ranks) and, in CUDA builds with
/// a visible GPU, the rank's CUDA device (cuda_device()). Safe to call twice.
/// Runs check_process_environment() once the rank is known.
/// Errors (dtr::Error, one line; MPI is initialised, call finalize()): MPI gives less than
/// MPI_THREAD_MULTIPLE; a DTR_* variable or OMP_NUM_THREADS with a bad value; a world of 1
/// while a launcher variable (WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_SIZE) says
/// this process is one of several (torchrun-style launch, or another MPI's mpiexec).
void init(int& argc, char**& argv);
/// Parses every DTR_* variable (env::check_environment; rank 0 prints a warning per unknown
/// one), and ignores SIGXFSZ so that a file-size limit makes writes fail with EFBIG (a clear
/// error naming the file) instead of killing the process. Called by init; tools that do not
/// call init (dtr-convert) call it themselves. Errors: the first bad value, one line.
void check_process_environment();
/// Finalises MPI if init initialised it (collectively, bounded by the communication
/// timeout). Safe to call when init was not called or failed.
void finalize();
bool is_initialized();
/// Rank in MPI_COMM_WORLD (0 without MPI).
int rank();
/// Size of MPI_COMM_WORLD (1 without MPI).
int world_size();
/// Rank among the processes of this node (MPI_COMM_TYPE_SHARED split).
int local_rank();
int local_size();
/// The CUDA device of this rank: local_rank() % (visible CUDA devices), made current by init()
/// (cudaSetDevice on the calling thread); -1 when the build has no CUDA backend or no device
/// is visible. Ranks of a node thus get distinct GPUs while local_size <= device count, and
/// share them round-robin beyond (use the MPI backend then: NCCL needs one GPU per rank).
int cuda_device();
/// CPU threads this rank uses for kernels.
int num_threads();
void set_num_threads(int n);
/// The maximum of `v` over all ranks (v itself when world size is 1). Blocking MPI_Allreduce on
/// the world, bounded by the communication timeout (runtime/watchdog.h).
int64_t all_ranks_max(int64_t v);
/// Aborts the whole job (MPI_Abort) after printing `msg` with the rank prefix.
[[noreturn]] void abort_job(const char* msg, int code = 1);

}  // namespace dtr
