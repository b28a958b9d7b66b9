// Rank and world discovery for `nsatron train` (docs/parallel.md, "Launching").
//
// The environment says how the process was started; it is read here and only here, and only
// to find the other ranks (never to change what is computed):
//   OMPI_COMM_WORLD_SIZE        Open MPI's mpirun
//   PMIX_RANK                   a PMIx launcher (Open MPI's mpirun, srun --mpi=pmix)
//   PMI_RANK, PMI_SIZE          a PMI-1/2 launcher (MPICH's hydra, srun --mpi=pmi2)
//   SLURM_STEP_NUM_TASKS, SLURM_NTASKS, SLURM_PROCID   Slurm's srun
// With one of the MPI launchers, World initialises MPI (MPI_Init_thread, FUNNELED: only the
// main thread calls MPI; OpenMP threads compute) and finalizes it when destroyed. Without,
// the run is a single process and MPI is never initialised.
//
// A Slurm step of N > 1 tasks whose processes see no PMI in the environment, or whose MPI
// world has one rank (an srun without --mpi=pmix), would run N independent copies of the
// job: World refuses it with an error that names both numbers.
//
// Errors and the exit of the job:
//   - World::together(fn) runs a phase every rank goes through (loading the config, opening
//     the data, resuming) and makes every rank agree on how it ended: when fn throws on any
//     rank, every rank throws JobError (the failing ranks their own message; the others a
//     short note naming the failed ranks), so all of them exit with MPI_Finalize, no rank
//     waits on another. Identical messages (a bad config on every rank) are printed once.
//   - JobError thrown by all ranks at the same point (e.g. too many bad steps, decided from
//     all-reduced values): printed by rank 0, every rank exits normally with its code.
//   - Any other error during training (a failed write on one rank, a lost peer): the rank
//     prints it with its number and aborts the job (MPI_Abort), so no rank hangs.
#pragma once
#include <functional>
#include <memory>
#include <type_traits>
#include <stdexcept>
#include <string>

#include "core/comm/communicator.h"

namespace nsatron {

// What the environment says about the launch.
struct LaunchInfo {
  std::string launcher;   // "mpirun (Open MPI)", "PMIx", "PMI", "srun (no PMI)" or "" (none)
  bool mpi = false;       // an MPI process manager started us: initialise MPI
  int slurm_tasks = 0;    // tasks of the Slurm step (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS); 0: none
  int slurm_procid = -1;  // SLURM_PROCID, -1 when not under Slurm
};
LaunchInfo detect_launch();

// An error every rank of the job raises together: exit with `code` after MPI_Finalize,
// printing the message when `print`.
struct JobError : std::runtime_error {
  JobError(int code, const std::string& message, bool print)
      : std::runtime_error(message), code(code), print(print) {}
  int code;
  bool print;
};

class World {
 public:
  // Discovers the launch and initialises MPI when there is one. Throws UserError when Slurm
  // started several tasks that MPI does not see as one world (only the task with
  // SLURM_PROCID 0 should print it: see quiet_errors()).
  World();
  ~World();  // MPI_Finalize when MPI was initialised here
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool mpi() const { return mpi_; }
  const LaunchInfo& launch() const { return launch_; }
  // The world communicator (MPI, or a single-process one).
  parallel::Communicator& comm() { return *comm_; }
  // "rank 3: " in a world of several ranks, "" otherwise.
  std::string rank_prefix() const;

  // Runs fn on every rank and agrees on the outcome (see above). Collective. The result type,
  // if any, must be default-constructible and movable.
  template <class F> auto together(F&& fn) -> decltype(fn()) {
    if constexpr (std::is_void_v<decltype(fn())>) {
      run_agreed([&] { fn(); });
    } else {
      decltype(fn()) result{};
      run_agreed([&] { result = fn(); });
      return result;
    }
  }
  void run_agreed(const std::function<void()>& fn);

  // Ends the job now with `code`: MPI_Abort in a world of several ranks, exit otherwise.
  [[noreturn]] void abort(int code);

 private:
  LaunchInfo launch_;
  bool mpi_ = false;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<parallel::Communicator> comm_;
};

}  // namespace nsatron
