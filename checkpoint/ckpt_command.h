// `nsatron ckpt`: look into checkpoints (docs/checkpoint.md, "Tools").
//   nsatron ckpt inspect DIR    step, tokens, config, and a table of the tensors
//   nsatron ckpt verify DIR     checks every checksum; exit 0 good, 1 damaged
// DIR: a run's checkpoint directory (follows `latest`) or one step directory.
#pragma once
#include <string>
#include <vector>

namespace nsatron::checkpoint {

// args: what follows `nsatron ckpt`. Returns the exit code: 0 success, 1 a damaged checkpoint
// (verify), 2 bad arguments. Throws UserError (exit 2 in main) for a path that is not a
// checkpoint, or one that inspect cannot read.
int ckpt_main(const std::vector<std::string>& args);

}  // namespace nsatron::checkpoint
