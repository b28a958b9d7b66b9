// Saving a checkpoint from several ranks, with the building blocks of checkpoint/checkpoint.h:
//   1. rank 0 stages the step directory (step_X.tmp-<pid>) and broadcasts its path;
//   2. every writing rank writes its file rank_<i>.h5 (i: its number among the writers, in
//      rank order) with its shards;
//   3. once every writer has closed its file (the agreement is the barrier), rank 0 commits
//      (fsync, rename, latest) and broadcasts the committed directory.
// Each phase runs through World::together: an error on any rank (say, a full disk on one
// writer) makes every rank throw JobError at the same point, and the staged directory is
// removed; the last committed checkpoint is untouched.
// Pure data parallelism has one writer (rank 0: the replicas are identical); ZeRO-1 makes
// every DP rank a writer of its tensors; TP/PP will make each shard's owner a writer.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "launch/world.h"

namespace nsatron {

// Collective over the world. `shards` and `writer` are this rank's; `layout` is recorded in
// every file ("tp=1 pp=1 dp=2"). Returns the committed step directory on every rank.
std::filesystem::path save_checkpoint_from_ranks(World& world, const std::filesystem::path& dir,
                                                 const checkpoint::TrainState& state,
                                                 const std::vector<checkpoint::ShardSpec>& shards, bool writer,
                                                 const std::string& layout, int keep);

}  // namespace nsatron
