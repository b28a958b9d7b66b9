#include "launch/dist_checkpoint.h"

#include "core/util/error.h"

namespace nsatron {

namespace ckpt = checkpoint;
namespace fs = std::filesystem;

fs::path save_checkpoint_from_ranks(World& world, const fs::path& dir, const ckpt::TrainState& state,
                                    const std::vector<ckpt::ShardSpec>& shards, bool writer,
                                    const std::string& layout, int keep) {
  parallel::Communicator& comm = world.comm();
  const bool root = world.rank() == 0;
  const std::vector<double> writers = parallel::all_gather_values(comm, {writer ? 1.0 : 0.0});
  std::int64_t index = 0, files = 0;
  for (int r = 0; r < world.size(); ++r) {
    if (writers[std::size_t(r)] != 0) {
      if (r < world.rank()) ++index;
      ++files;
    }
  }
  NSA_CHECK(files > 0, "save_checkpoint_from_ranks: no rank writes");
  const fs::path staged = world.together([&] { return root ? ckpt::stage_checkpoint(dir, state.step) : fs::path(); });
  const fs::path staging = parallel::broadcast_string(comm, staged.string(), 0);
  try {
    world.together([&] {
      if (writer)
        ckpt::write_checkpoint_file(staging / ckpt::rank_file_name(index), shards, state,
                                    ckpt::FileLayout{index, files, layout});
    });
  } catch (const JobError&) {
    if (root) {
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
    throw;
  }
  const fs::path committed =
      world.together([&] { return root ? ckpt::commit_checkpoint(dir, staging, state.step, keep) : fs::path(); });
  return parallel::broadcast_string(comm, committed.string(), 0);
}

}  // namespace nsatron
