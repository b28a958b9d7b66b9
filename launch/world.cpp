#include "launch/world.h"

#include <mpi.h>

#include <cstdlib>
#include <iostream>

#include "core/comm/single_communicator.h"
#include "core/config/config.h"
#include "core/util/error.h"
#include "parallel/mpi_communicator.h"

namespace nsatron {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end && *end == '\0' && x >= 0 && x < (1L << 30) ? int(x) : fallback;
}

// FNV-1a, 64 bits: to tell identical error messages apart from different ones across ranks.
std::uint64_t text_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo info;
  info.slurm_tasks = env_int("SLURM_STEP_NUM_TASKS", env_int("SLURM_NTASKS", 0));
  info.slurm_procid = env_int("SLURM_PROCID", -1);
  if (env("OMPI_COMM_WORLD_SIZE")) info.launcher = "mpirun (Open MPI)";
  else if (env("PMIX_RANK")) info.launcher = "PMIx";
  else if (env("PMI_RANK") || env("PMI_SIZE")) info.launcher = "PMI";
  info.mpi = !info.launcher.empty();
  if (!info.mpi && info.slurm_tasks > 0) info.launcher = "srun (no PMI)";
  return info;
}

World::World() {
  launch_ = detect_launch();
  auto srun_error = [&](int mpi_world) {
    const std::string n = std::to_string(launch_.slurm_tasks);
    return UserError("Slurm started " + n + " tasks for this step (SLURM_STEP_NUM_TASKS / SLURM_NTASKS = " + n +
                     ") but MPI sees a world of " + std::to_string(mpi_world) +
                     " rank: the tasks were not connected (an srun without PMIx), and would train " + n +
                     " independent copies. Launch with `srun --mpi=pmix -n " + n +
                     " nsatron train CONFIG` (or set MpiDefault=pmix in slurm.conf); to train on one rank, use "
                     "`srun -n 1`");
  };
  if (launch_.slurm_tasks > 1 && !launch_.mpi) throw srun_error(1);
  if (launch_.mpi) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw std::runtime_error("MPI_Init_thread failed (launcher: " + launch_.launcher + ")");
    mpi_ = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (launch_.slurm_tasks > 1 && size_ == 1) {
      MPI_Finalize();
      mpi_ = false;
      throw srun_error(1);
    }
  }
  if (size_ > 1) comm_ = parallel::MpiCommunicator::world("world");
  else comm_ = std::make_shared<parallel::SingleCommunicator>("world");
}

World::~World() {
  comm_.reset();
  if (mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

std::string World::rank_prefix() const { return size_ > 1 ? "rank " + std::to_string(rank_) + ": " : ""; }

void World::abort(int code) {
  std::cout.flush();
  std::cerr.flush();
  if (mpi_ && size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

void World::run_agreed(const std::function<void()>& fn) {
  bool failed = false;
  int code = 0;
  std::string message;  // as main() prints it, without the rank
  try {
    fn();
  } catch (const JobError&) {
    throw;
  } catch (const ConfigError& e) {
    failed = true, code = 2;
    message = e.what();
  } catch (const UserError& e) {
    failed = true, code = 2;
    message = std::string("nsatron train: ") + e.what();
  } catch (const EnvironmentError& e) {  // e.g. a full disk: not bad input, not a bug
    failed = true, code = 1;
    message = std::string("nsatron train: ") + e.what();
  } catch (const std::exception& e) {
    failed = true, code = 1;
    message = std::string("nsatron train: internal error: ") + e.what();
  }
  if (size_ == 1) {
    if (failed) throw JobError(code, message, true);
    return;
  }
  const std::uint64_t h = failed ? text_hash(message) : 0;
  const std::vector<double> all = parallel::all_gather_values(
      *comm_, {failed ? 1.0 : 0.0, double(code), double(h & 0xffffffffu), double(h >> 32)});
  std::vector<int> failed_ranks;
  int first_code = 0;
  bool printed_same = false;  // a lower rank failed with the same message
  for (int r = 0; r < size_; ++r) {
    const double* x = &all[std::size_t(r) * 4];
    if (x[0] == 0) continue;
    failed_ranks.push_back(r);
    if (!first_code) first_code = int(x[1]);
    if (r < rank_ && failed && x[2] == double(h & 0xffffffffu) && x[3] == double(h >> 32)) printed_same = true;
  }
  if (failed_ranks.empty()) return;
  if (failed) {
    std::string text = message;
    if (rank_ != 0) {  // name the rank: "nsatron train: rank 3: ..." or "rank 3: FILE:LINE: ..."
      const std::string head = "nsatron train: ";
      text = text.rfind(head, 0) == 0 ? head + rank_prefix() + text.substr(head.size()) : rank_prefix() + text;
    }
    throw JobError(code, text, !printed_same);
  }
  std::string list;
  for (int r : failed_ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
  throw JobError(first_code, "nsatron train: " + rank_prefix() + "stopping: rank " + list + " failed (above)",
                 rank_ == 0);
}

}  // namespace nsatron
