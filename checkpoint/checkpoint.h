// HDF5 checkpoints: atomic, verified, resumable bit for bit. docs/checkpoint.md has the
// format (readable with h5py), the commit protocol and the resume rules; this header is the
// API the trainer and the `nsatron ckpt` tools use.
//
//   CHECKPOINT_DIR/
//     latest                 "step_00001000\n": the newest committed checkpoint
//     step_00001000/         one committed checkpoint
//       rank_00000.h5        one HDF5 file per writing rank (one in a single-process run)
//     step_00002000.tmp-4242/  a save in progress (or killed): ignored by readers
//
// Each file holds, for each tensor it owns, a dataset at the parameter's path
// ("model/layers.3/attn/wqkv") and the AdamW moments at "optim/m/<name>", "optim/v/<name>":
// fp32, with attributes crc32 (CRC-32 of the bytes), global_shape and offset (the shard's
// place in the full tensor). Root attributes hold the TrainState and the file's manifest.
//
// Errors in a checkpoint (a flipped byte, a truncated file, a missing dataset or file, a
// shape that does not match the config) throw nsatron::UserError naming the file and the
// dataset. The model tensors must be fp32 (the master weights).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/model/params.h"
#include "core/tensor/tensor.h"

namespace nsatron::checkpoint {

namespace fs = std::filesystem;

// The format this build writes, and the newest it reads.
inline constexpr std::int64_t kFormatVersion = 1;
inline constexpr const char* kFormatName = "nsatron-checkpoint";

// Everything besides the tensors that a resumed run needs to continue the same bits.
struct TrainState {
  std::int64_t step = 0;             // optimizer steps completed (the checkpoint's step)
  std::int64_t consumed_tokens = 0;  // training tokens consumed so far
  std::int64_t optimizer_step = 0;   // AdamW's t of the last update (steps minus skipped steps)
  std::string sampler_position;      // data::SamplerPosition::serialize()
  std::string rng;                   // every RNG state, serialised by its owner ("" if none)
  std::string config_toml;           // to_toml(config) of the run that wrote it
  // More string attributes, stored as root attributes "extra.<key>"; keys are [A-Za-z0-9_]+.
  std::map<std::string, std::string> extra;
  bool operator==(const TrainState&) const = default;
};

// ---- saving -------------------------------------------------------------------------------

// Saves a single-process run: the tensors of `params` (weights), `m` and `v` (AdamW
// moments, flat fp32 buffers laid out like params.flat_weights()) and `state` as
// dir/step_<state.step>/rank_00000.h5, committed atomically (stage_checkpoint, write,
// commit_checkpoint), with the shards of param_shards(params, ..., 0, 0, params.total()).
// Keeps the newest `keep` checkpoints (0: all). Returns the committed step directory.
// Tensors on a GPU are copied to the host first.
fs::path save_checkpoint(const fs::path& dir, const ParamStore& params, const Tensor& m, const Tensor& v,
                         const TrainState& state, int keep);

// The building blocks of a save, for runs whose ranks write their own shards:
//   1. one process: staging = stage_checkpoint(dir, step)   (creates step_X.tmp-<pid>/)
//   2. every rank: write_checkpoint_file(staging / rank_file_name(rank), its shards, ...)
//   3. after all ranks have closed their files, one process: commit_checkpoint(...)
fs::path stage_checkpoint(const fs::path& dir, std::int64_t step);

// One shard (or the whole) of a logical tensor, as written to a file.
struct ShardSpec {
  std::string name;    // dataset path: "model/layers.3/attn/wqkv", "optim/m/model/layers.3/attn/wqkv"
  Shape global_shape;  // the full tensor's shape
  Shape offset;        // index of the shard's first element in the full tensor (zeros: whole)
  Shape shape;         // the shard's shape; offset + shape <= global_shape in each dimension
  const float* data = nullptr;  // shape_numel(shape) values, row-major
};

// Which part of the run a file holds.
struct FileLayout {
  std::int64_t rank = 0;       // this file's number, in [0, num_files): rank_<rank>.h5
  std::int64_t num_files = 1;  // files in the checkpoint directory
  std::string layout = "tp=1 pp=1 dp=1";  // the writing run's parallel layout (informational)
};

// The shards a rank writes for its parameters: for every parameter of `params` that is not a
// replica (ParamInfo::replica) and whose offset lies in [begin, end) of the flat buffers,
//   - the weights:  {name, global_shape, global_offset, shape, weights + offset},
//   - the moments:  {"optim/m/" + name, ..., m + (offset - m_begin)} and the same for "optim/v/",
// all the weights first, then all m, then all v (parameter order within each). `weights` is
// the whole flat buffer (params.flat_weights()); `m` and `v` hold the moments of the flat
// range starting at m_begin: m_begin = 0 when they are whole like the weights, m_begin =
// begin with ZeRO-1 where a rank keeps only its range [begin, end). With m = v = nullptr the
// moments are left out. The pointers must be host memory holding fp32, and stay valid until
// write_checkpoint_file has used the shards (the specs point into them, nothing is copied).
// Every layout writes through it: one process (0, total), data parallelism (the rank that
// writes, (0, total)), ZeRO-1 (each DP rank its range), tensor and pipeline parallelism (each
// rank its blocks: shape, global_shape and global_offset from ParamStore::declare). Throws
// std::invalid_argument when a parameter straddles `end` (ZeRO-1 ranges hold whole tensors),
// when the range is outside [0, params.total()], or when a name starts with "optim/".
std::vector<ShardSpec> param_shards(const ParamStore& params, const float* weights, const float* m, const float* v,
                                    std::int64_t m_begin, std::int64_t begin, std::int64_t end);

std::string rank_file_name(std::int64_t rank);  // "rank_00000.h5"
std::string step_dir_name(std::int64_t step);   // "step_00001000"

// Writes one HDF5 file (which must not exist) with the shards, their checksums and the
// state. Does not fsync; commit_checkpoint does. First checks that the file's directory has
// room for it (checkpoint_file_bytes): if not, throws EnvironmentError "checkpoint step N:
// needs X MiB, Y MiB free in DIR" before writing anything.
void write_checkpoint_file(const fs::path& file, const std::vector<ShardSpec>& shards, const TrainState& state,
                           const FileLayout& layout);

// Bytes a checkpoint file of these shards and state needs on disk, at most: the tensor data
// (fp32), the state's strings, and HDF5's per-dataset metadata (a generous 4 KiB each plus
// 1 MiB for the file).
std::uintmax_t checkpoint_file_bytes(const std::vector<ShardSpec>& shards, const TrainState& state);

// fsyncs every file in `staging` and the directory, renames it to dir/step_<step>
// (atomically replacing an existing directory of that name), fsyncs dir, atomically points
// dir/latest at it, then removes leftover *.tmp-* directories and, when keep > 0, all but
// the newest `keep` committed checkpoints (never the one `latest` names). Returns the step
// directory.
fs::path commit_checkpoint(const fs::path& dir, const fs::path& staging, std::int64_t step, int keep);

// ---- finding and loading --------------------------------------------------------------------

// The checkpoint to resume from under a run's checkpoint directory.
struct ResumeChoice {
  std::optional<fs::path> checkpoint;  // empty: nothing to resume (no checkpoints at all)
  std::vector<std::string> warnings;   // what was wrong with the checkpoints passed over
};
// Follows `latest` when it names a good checkpoint (every checksum verified). Otherwise
// (latest missing, unreadable, naming a missing or corrupt directory) it says so in
// `warnings` and takes the newest committed step_* directory that verifies. Deletes
// nothing. Throws UserError when checkpoints exist but none of them verifies.
ResumeChoice find_resume(const fs::path& dir);

// A step directory as given, or for a run's checkpoint directory the one `latest` names.
// Throws UserError when it is neither, or when latest names a missing directory.
fs::path resolve_checkpoint(const fs::path& path);

// The committed step directories under dir (step_<digits>, no suffix), by ascending step.
std::vector<fs::path> list_checkpoints(const fs::path& dir);
// The HDF5 files of a step directory, by rank (rank_*.h5). Throws UserError when there are
// none or when some rank's file is missing.
std::vector<fs::path> checkpoint_files(const fs::path& step_dir);

// What part of the checkpoint's model a ParamStore holds.
struct LoadScope {
  // false: every tensor (the checkpoint may hold no tensor that params lacks). true: some
  // tensors (a pipeline stage's layers); the checkpoint's others are skipped, but each must be
  // one of `model_names` (the whole model's parameter names), when given.
  bool partial = false;
  std::vector<std::string> model_names;
  static LoadScope whole_model() { return {}; }
  static LoadScope part_of(std::vector<std::string> names = {}) { return {true, std::move(names)}; }
};

// Loads `path` (resolve_checkpoint) into params, m and v (flat buffers laid out like
// params.flat_weights(), each parameter's moments at its offset) and returns the state.
// Every tensor of params must be in the checkpoint with its global shape (ParamInfo::
// global_shape; "model/layers.3/attn/wqkv: checkpoint shape [..] but the config gives [..]")
// and every tensor of the checkpoint must be one of params, or with a partial scope one of
// scope.model_names ("...: in the checkpoint but not in the config's model"). Each full tensor is assembled
// from whatever shards the files hold (a checkpoint from any parallel layout), checksums
// checked; a whole parameter is read straight into the flat buffer, a block (a tensor-
// parallel shard, !is_whole(p)) is assembled into a temporary buffer and its block
// (global_offset, shape) copied out. Replicas load like any other parameter. On error the
// contents of params, m and v are unspecified.
TrainState load_checkpoint(const fs::path& path, ParamStore& params, Tensor& m, Tensor& v,
                           const LoadScope& scope = LoadScope::whole_model());

// Loads only the model weights (not the moments), e.g. to sample from a checkpoint; the
// same checks as load_checkpoint for the weights. Returns the state.
TrainState load_weights(const fs::path& path, ParamStore& params, const LoadScope& scope = LoadScope::whole_model());

// The state of a checkpoint (from its first file), without reading the tensors.
TrainState read_train_state(const fs::path& path);

// A full logical tensor assembled from the shards in `files` (the files of one step
// directory), checksums checked. Throws UserError when no file holds `name`, the shards
// disagree on the global shape, or they leave part of the tensor uncovered.
struct FullTensor {
  Shape shape;
  std::vector<float> data;
};
FullTensor read_full_tensor(const std::vector<fs::path>& files, const std::string& name);

// Every tensor of a checkpoint (path as for resolve_checkpoint), assembled and checked, one
// at a time, in the order of the files' manifests: the weights, then optim/m, then optim/v.
void for_each_tensor(const fs::path& path, const std::function<void(const std::string& name, const FullTensor&)>& fn);

// Checks everything a load would (files present and readable, root attributes and their
// checksum, every dataset listed in the manifest present, fp32, with a matching CRC-32,
// every tensor's shards covering it, moments for every weight), without a ParamStore.
// `path` as for resolve_checkpoint. Returns one line per problem ("FILE: DATASET: what");
// empty means good.
std::vector<std::string> verify_checkpoint(const fs::path& path);

}  // namespace nsatron::checkpoint
