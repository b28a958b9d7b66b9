// Checkpoints: round trip, the commit protocol (latest, keep, staging directories), resume
// with fallback, corruption detected and named, sharded files assembled.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "checkpoint/checkpoint.h"
#include "checkpoint/h5file.h"
#include "ckpt_test_util.h"
#include "core/util/error.h"

using namespace ckpt_test;
namespace ck = nsatron::checkpoint;
using nsatron::UserError;

namespace {


bool any_contains(const std::vector<std::string>& lines, std::vector<std::string> parts) {
  for (const auto& l : lines) {
    bool all = true;
    for (const auto& p : parts) all = all && l.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

fs::path save(const fs::path& dir, std::int64_t step, int keep = 0, std::uint64_t seed = 0) {
  Model mo = make_model(seed ? seed : std::uint64_t(step));
  return ck::save_checkpoint(dir, mo.params, mo.m, mo.v, make_state(step), keep);
}

}  // namespace

TEST(Checkpoint, RoundTripIsBitExact) {
  TempDir tmp;
  Model a = make_model(1);
  const ck::TrainState st = make_state(42);
  const fs::path dir = tmp.path / "ckpt";
  const fs::path step_dir = ck::save_checkpoint(dir, a.params, a.m, a.v, st, 0);
  EXPECT_EQ(step_dir, dir / "step_00000042");
  EXPECT_EQ(read_text(dir / "latest"), "step_00000042\n");
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"latest", "step_00000042"}));
  EXPECT_EQ(entries(step_dir), (std::vector<std::string>{"rank_00000.h5"}));

  Model b = make_model(2);  // other weights and moments, to be overwritten
  ASSERT_FALSE(same_bits(a.params.flat_weights(), b.params.flat_weights()));
  const ck::TrainState got = ck::load_checkpoint(dir, b.params, b.m, b.v);
  EXPECT_TRUE(same_bits(a.params.flat_weights(), b.params.flat_weights()));
  EXPECT_TRUE(same_bits(a.m, b.m));
  EXPECT_TRUE(same_bits(a.v, b.v));
  EXPECT_EQ(got, st);
  EXPECT_EQ(got.config_toml, st.config_toml);
  EXPECT_EQ(ck::read_train_state(step_dir), st);
  EXPECT_TRUE(ck::verify_checkpoint(dir).empty());
  EXPECT_TRUE(ck::verify_checkpoint(step_dir).empty());

  Model c = make_model(3);
  ck::load_weights(step_dir, c.params);
  EXPECT_TRUE(same_bits(a.params.flat_weights(), c.params.flat_weights()));

  // The full tensors, as the reader assembles them.
  const auto t = ck::read_full_tensor(ck::checkpoint_files(step_dir), "model/layers.0/attn/cmp_wk");
  EXPECT_EQ(t.shape, (nsatron::Shape{2, 12, 4}));
  const auto w = a.params.weight("model/layers.0/attn/cmp_wk");
  EXPECT_EQ(std::memcmp(t.data.data(), w.raw(), w.nbytes()), 0);
}

TEST(Checkpoint, LatestFollowsTheNewestCommit) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  for (int s : {10, 20, 30}) {
    save(dir, s);
    EXPECT_EQ(read_text(dir / "latest"), ck::step_dir_name(s) + "\n");
    EXPECT_EQ(ck::resolve_checkpoint(dir), dir / ck::step_dir_name(s));
  }
  const auto rc = ck::find_resume(dir);
  ASSERT_TRUE(rc.checkpoint);
  EXPECT_EQ(*rc.checkpoint, dir / "step_00000030");
  EXPECT_TRUE(rc.warnings.empty()) << joined(rc.warnings);
  EXPECT_EQ(ck::list_checkpoints(dir).size(), 3u);
  EXPECT_FALSE(ck::find_resume(tmp.path / "nothing_here").checkpoint);
}

TEST(Checkpoint, KeepDeletesOldOnesOnlyAtCommit) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  for (int s : {1, 2, 3}) save(dir, s, /*keep=*/2);
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"latest", "step_00000002", "step_00000003"}));

  // A save that stops before its commit (staged and written, killed before the rename)
  // deletes nothing and moves nothing.
  Model mo = make_model(4);
  const fs::path staging = ck::stage_checkpoint(dir, 4);
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"latest", "step_00000002", "step_00000003",
                                                    "step_00000004.tmp-" + std::to_string(getpid())}));
  std::vector<ck::ShardSpec> shards;
  for (const auto& p : mo.params.infos())
    shards.push_back({p.name, p.shape, nsatron::Shape(p.shape.size(), 0), p.shape,
                      mo.params.flat_weights().data<float>() + p.offset});
  ck::write_checkpoint_file(staging / ck::rank_file_name(0), shards, make_state(4), {});
  EXPECT_EQ(read_text(dir / "latest"), "step_00000003\n");
  const auto rc = ck::find_resume(dir);
  ASSERT_TRUE(rc.checkpoint);
  EXPECT_EQ(*rc.checkpoint, dir / "step_00000003");
  EXPECT_TRUE(rc.warnings.empty()) << joined(rc.warnings);
  EXPECT_EQ(ck::list_checkpoints(dir).size(), 2u);

  // The next committed save removes the staging directory and applies keep.
  save(dir, 5, 2);
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"latest", "step_00000003", "step_00000005"}));
  // keep = 1 never deletes what latest names, even when older-numbered than others.
  save(dir, 4, 1);
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"latest", "step_00000004"}));
  EXPECT_TRUE(ck::verify_checkpoint(dir).empty());
}

TEST(Checkpoint, SavingAnExistingStepReplacesItWhole) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  save(dir, 7, 0, /*seed=*/100);
  save(dir, 7, 0, /*seed=*/200);
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"latest", "step_00000007"}));
  Model want = make_model(200), got = make_model(1);
  ck::load_checkpoint(dir, got.params, got.m, got.v);
  EXPECT_TRUE(same_bits(want.params.flat_weights(), got.params.flat_weights()));
  EXPECT_TRUE(same_bits(want.v, got.v));
}

TEST(Checkpoint, LeftoverStagingDirectoryIsIgnoredThenCleaned) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  save(dir, 1);
  // A save killed half way: a staging directory with a partial file.
  const fs::path junk = dir / "step_00000002.tmp-999999";
  fs::create_directories(junk);
  write_text(junk / "rank_00000.h5", "\x89HDF\r\n\x1a\n partial");
  EXPECT_EQ(ck::list_checkpoints(dir), (std::vector<fs::path>{dir / "step_00000001"}));
  const auto rc = ck::find_resume(dir);
  ASSERT_TRUE(rc.checkpoint);
  EXPECT_EQ(*rc.checkpoint, dir / "step_00000001");
  EXPECT_TRUE(rc.warnings.empty()) << joined(rc.warnings);
  EXPECT_TRUE(ck::verify_checkpoint(dir).empty());
  save(dir, 2);
  EXPECT_FALSE(fs::exists(junk));
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"latest", "step_00000001", "step_00000002"}));
}

// ---- corruption ---------------------------------------------------------------------------

TEST(Corruption, FlippedByteInADatasetIsNamed) {
  for (const std::string ds : {"model/layers.0/attn/wqkv", "optim/v/model/final_norm", "optim/m/model/embedding"}) {
    TempDir tmp;
    const fs::path dir = tmp.path / "run";
    const fs::path file = save(dir, 3) / "rank_00000.h5";
    flip_data_byte(file, ds, 6);
    const auto problems = ck::verify_checkpoint(dir);
    ASSERT_EQ(problems.size(), 1u) << joined(problems);
    EXPECT_TRUE(any_contains(problems, {file.string(), ds, "checksum mismatch"})) << joined(problems);
    Model mo = make_model(9);
    expect_user_error([&] { ck::load_checkpoint(dir, mo.params, mo.m, mo.v); }, {file.string(), ds, "checksum"});
    expect_user_error([&] { ck::find_resume(dir); }, {"no usable checkpoint", ds, "nothing was deleted"});
    // Flipping it back makes it good again: the detection is the checksum, not a side effect.
    flip_data_byte(file, ds, 6);
    EXPECT_TRUE(ck::verify_checkpoint(dir).empty());
  }
}

TEST(Corruption, DamagedOrEditedStateAttributesAreNamed) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  const fs::path file = save(dir, 3) / "rank_00000.h5";
  // A flipped byte inside the config text: HDF5's object header checksum catches it.
  const std::string bytes = read_text(file);
  const auto at = bytes.find("vocab_size = 256");
  ASSERT_NE(at, std::string::npos);
  xor_byte(file, at + 13, 0x01);  // '2' -> '3'
  auto problems = ck::verify_checkpoint(dir);
  EXPECT_TRUE(any_contains(problems, {file.string(), "incorrect metadata checksum"})) << joined(problems);
  expect_user_error([&] { ck::read_train_state(dir); }, {file.string()});
  xor_byte(file, at + 13, 0x01);
  ASSERT_TRUE(ck::verify_checkpoint(dir).empty());
  // A value changed through HDF5 (which then recomputes its own checksums): state_crc32.
  {
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(f, "step", H5P_DEFAULT);
    const std::int64_t step = 4;
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &step), 0);
    H5Aclose(a);
    H5Fclose(f);
  }
  problems = ck::verify_checkpoint(dir);
  EXPECT_TRUE(any_contains(problems, {file.string(), "root attributes: checksum mismatch"})) << joined(problems);
  expect_user_error([&] { ck::read_train_state(dir); }, {file.string(), "state_crc32"});
}

// Every single-byte flip outside the data regions (superblock, object headers, attributes,
// free space) is either reported by verify or leaves what a load returns unchanged; none hangs.
TEST(Corruption, MetadataByteFlipsAreDetectedOrHarmless) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // HDF5 1.10 prints noise at exit otherwise
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model mo = make_model(1);
  const ck::TrainState st = make_state(5);
  const fs::path step_dir = ck::save_checkpoint(dir, mo.params, mo.m, mo.v, st, 0);
  const fs::path file = step_dir / "rank_00000.h5";
  const std::string orig = read_text(file);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> regions;
  for (const auto& p : mo.params.infos())
    for (const std::string prefix : {"", "optim/m/", "optim/v/"}) regions.push_back(data_region(file, prefix + p.name));
  int flipped = 0, detected = 0;
  for (std::size_t i = 0; i < orig.size(); i += 5) {
    bool in_data = false;
    for (const auto& [off, size] : regions) in_data = in_data || (i >= off && i < off + size);
    if (in_data) continue;
    std::string bad = orig;
    bad[i] = char(bad[i] ^ 0x10);
    write_text(file, bad);
    ++flipped;
    if (!ck::verify_checkpoint(dir).empty()) {
      ++detected;
      continue;
    }
    Model got = make_model(2);
    ck::TrainState gst;
    ASSERT_NO_THROW(gst = ck::load_checkpoint(dir, got.params, got.m, got.v)) << "byte " << i;
    ASSERT_EQ(gst, st) << "byte " << i;
    ASSERT_TRUE(same_bits(got.params.flat_weights(), mo.params.flat_weights())) << "byte " << i;
    ASSERT_TRUE(same_bits(got.m, mo.m)) << "byte " << i;
    ASSERT_TRUE(same_bits(got.v, mo.v)) << "byte " << i;
  }
  write_text(file, orig);
  EXPECT_TRUE(ck::verify_checkpoint(dir).empty());
  std::cout << flipped << " metadata bytes flipped, " << detected << " detected, the rest harmless\n";
  EXPECT_GT(detected, flipped / 2);
}

TEST(Corruption, TruncatedFileIsNamed) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  const fs::path file = save(dir, 3) / "rank_00000.h5";
  for (std::uintmax_t keep_bytes : {fs::file_size(file) - 1, fs::file_size(file) / 2, std::uintmax_t(100)}) {
    fs::resize_file(file, keep_bytes);
    const auto problems = ck::verify_checkpoint(dir);
    ASSERT_FALSE(problems.empty()) << keep_bytes;
    EXPECT_TRUE(any_contains(problems, {file.string(), "cannot open as HDF5"})) << joined(problems);
    Model mo = make_model(9);
    expect_user_error([&] { ck::load_checkpoint(dir, mo.params, mo.m, mo.v); }, {file.string()});
  }
  fs::resize_file(file, 0);
  EXPECT_TRUE(any_contains(ck::verify_checkpoint(dir), {file.string()}));
}

TEST(Corruption, MissingDatasetIsNamed) {
  for (const std::string ds : {"optim/m/model/final_norm", "model/layers.1/mlp/w_in"}) {
    TempDir tmp;
    const fs::path dir = tmp.path / "run";
    const fs::path file = save(dir, 3) / "rank_00000.h5";
    unlink_dataset(file, ds);
    const auto problems = ck::verify_checkpoint(dir);
    EXPECT_TRUE(any_contains(problems, {file.string(), ds, "dataset is missing"})) << joined(problems);
    Model mo = make_model(9);
    expect_user_error([&] { ck::load_checkpoint(dir, mo.params, mo.m, mo.v); }, {file.string(), ds, "missing"});
  }
}

TEST(Corruption, MissingRankFileIsNamed) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model mo = make_model(1);
  const fs::path staging = ck::stage_checkpoint(dir, 5);
  const auto& p = mo.params.infos().front();
  ck::ShardSpec s{p.name, p.shape, {0, 0}, p.shape, mo.params.flat_weights().data<float>()};
  ck::write_checkpoint_file(staging / ck::rank_file_name(0), {s}, make_state(5), {0, 2, "tp=2 pp=1 dp=1"});
  ck::commit_checkpoint(dir, staging, 5, 0);
  const auto problems = ck::verify_checkpoint(dir);
  EXPECT_TRUE(any_contains(problems, {"step_00000005/rank_00001.h5", "missing"})) << joined(problems);
  // read_full_tensor takes the files it is given: rank 0 alone covers this tensor.
  EXPECT_EQ(ck::read_full_tensor({dir / "step_00000005" / "rank_00000.h5"}, p.name).shape, p.shape);
  expect_user_error([&] { ck::load_weights(dir, mo.params); }, {"rank_00001.h5", "missing"});
}

TEST(Corruption, LatestNamingAMissingDirectoryIsNamed) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  save(dir, 1);
  save(dir, 2);
  write_text(dir / "latest", "step_00000099\n");
  EXPECT_TRUE(any_contains(ck::verify_checkpoint(dir), {"latest", "step_00000099", "does not exist"}));
  expect_user_error([&] { ck::resolve_checkpoint(dir); }, {"latest", "step_00000099", "does not exist"});
  const auto rc = ck::find_resume(dir);
  ASSERT_TRUE(rc.checkpoint);
  EXPECT_EQ(*rc.checkpoint, dir / "step_00000002");
  EXPECT_TRUE(any_contains(rc.warnings, {"step_00000099", "does not exist"})) << joined(rc.warnings);
  EXPECT_EQ(read_text(dir / "latest"), "step_00000099\n");  // reported, not repaired
  write_text(dir / "latest", "garbage");
  EXPECT_TRUE(any_contains(ck::find_resume(dir).warnings, {"latest", "does not name a step directory"}));
}

TEST(Resume, FallsBackToTheNewestGoodCheckpointAndDeletesNothing) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  for (int s : {1, 2, 3}) save(dir, s);
  const fs::path f3 = dir / "step_00000003" / "rank_00000.h5";
  const fs::path f2 = dir / "step_00000002" / "rank_00000.h5";
  flip_data_byte(f3, "model/embedding", 100);
  const std::string f3_bytes = read_text(f3);
  const auto before = entries(dir);

  auto rc = ck::find_resume(dir);
  ASSERT_TRUE(rc.checkpoint);
  EXPECT_EQ(*rc.checkpoint, dir / "step_00000002");
  EXPECT_TRUE(any_contains(rc.warnings, {"latest names step_00000003", "damaged", "model/embedding", "checksum"}))
      << joined(rc.warnings);
  EXPECT_TRUE(any_contains(rc.warnings, {"resuming from", "step_00000002"})) << joined(rc.warnings);
  EXPECT_EQ(entries(dir), before);
  EXPECT_EQ(read_text(f3), f3_bytes);
  EXPECT_EQ(read_text(dir / "latest"), "step_00000003\n");
  // What it picked loads and is step 2's content.
  Model want = make_model(2), got = make_model(9);
  EXPECT_EQ(ck::load_checkpoint(*rc.checkpoint, got.params, got.m, got.v).step, 2);
  EXPECT_TRUE(same_bits(want.params.flat_weights(), got.params.flat_weights()));

  fs::resize_file(f2, fs::file_size(f2) / 3);
  rc = ck::find_resume(dir);
  ASSERT_TRUE(rc.checkpoint);
  EXPECT_EQ(*rc.checkpoint, dir / "step_00000001");
  EXPECT_TRUE(any_contains(rc.warnings, {"step_00000002", "damaged"})) << joined(rc.warnings);

  fs::remove(dir / "step_00000001" / "rank_00000.h5");
  expect_user_error([&] { ck::find_resume(dir); }, {"no usable checkpoint", "step_00000001", "step_00000002",
                                                    "step_00000003"});
  EXPECT_EQ(entries(dir), before);

  // Without `latest` (killed between the rename and the pointer), the newest good one.
  TempDir tmp2;
  const fs::path d2 = tmp2.path / "run";
  save(d2, 1);
  save(d2, 2);
  fs::remove(d2 / "latest");
  rc = ck::find_resume(d2);
  ASSERT_TRUE(rc.checkpoint);
  EXPECT_EQ(*rc.checkpoint, d2 / "step_00000002");
  EXPECT_TRUE(any_contains(rc.warnings, {"latest", "missing"}));
}

TEST(Load, ShapeMismatchNamesTheTensor) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  save(dir, 1);
  Model other = make_model(1, small_model(/*wqkv_rows=*/32));
  expect_user_error([&] { ck::load_checkpoint(dir, other.params, other.m, other.v); },
                    {"model/layers.0/attn/wqkv: checkpoint shape [24, 8] but the config gives [32, 8]"});
  auto specs = small_model();
  specs.pop_back();                                // final_norm not in the config
  specs.push_back({"model/lm_head", {16, 8}});     // lm_head not in the checkpoint
  Model third = make_model(1, specs);
  expect_user_error([&] { ck::load_checkpoint(dir, third.params, third.m, third.v); },
                    {"model/final_norm: in the checkpoint but not in the config",
                     "model/lm_head: in the config's model but not in the checkpoint"});
}

// ---- shards -------------------------------------------------------------------------------

TEST(Shards, AnySetOfShardsCoveringATensorAssemblesIt) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model mo = make_model(5);
  const auto& P = mo.params;
  // Two "ranks": wqkv split by rows (TP column-parallel), cmp_wk split along its last dim,
  // attn_norm replicated in both, the rest (with all moments) on rank 0.
  std::vector<std::vector<float>> keep;  // storage for shard copies
  auto shard = [&](const std::string& name, const std::string& ds, nsatron::Shape off, nsatron::Shape shp) {
    const auto& p = P.info(name);
    std::vector<std::int64_t> stride(p.shape.size(), 1);
    for (std::size_t d = p.shape.size() - 1; d-- > 0;) stride[d] = stride[d + 1] * p.shape[d + 1];
    std::vector<float> out;
    std::vector<std::int64_t> idx(shp.size(), 0);
    const float* src = (ds == name ? P.flat_weights() : ds.rfind("optim/m/", 0) == 0 ? mo.m : mo.v).data<float>() + p.offset;
    for (std::int64_t n = 0; n < nsatron::shape_numel(shp); ++n) {
      std::int64_t at = 0;
      for (std::size_t d = 0; d < shp.size(); ++d) at += (off[d] + idx[d]) * stride[d];
      out.push_back(src[at]);
      for (std::size_t d = shp.size(); d-- > 0;) {
        if (++idx[d] < shp[d]) break;
        idx[d] = 0;
      }
    }
    keep.push_back(std::move(out));
    return ck::ShardSpec{ds, p.shape, off, shp, keep.back().data()};
  };
  keep.reserve(1000);
  std::vector<ck::ShardSpec> r0, r1;
  for (const auto& p : P.infos())
    for (const std::string prefix : {"", "optim/m/", "optim/v/"}) {
      const std::string ds = prefix + p.name;
      if (p.name == "model/layers.0/attn/wqkv") {
        r0.push_back(shard(p.name, ds, {0, 0}, {10, 8}));
        r1.push_back(shard(p.name, ds, {10, 0}, {14, 8}));
      } else if (p.name == "model/layers.0/attn/cmp_wk") {
        r0.push_back(shard(p.name, ds, {0, 0, 0}, {2, 12, 1}));
        r1.push_back(shard(p.name, ds, {0, 0, 1}, {2, 12, 3}));
      } else if (p.name == "model/layers.0/attn_norm") {
        r0.push_back(shard(p.name, ds, {0}, {8}));
        r1.push_back(shard(p.name, ds, {0}, {8}));
      } else {
        r0.push_back(shard(p.name, ds, nsatron::Shape(p.shape.size(), 0), p.shape));
      }
    }
  const fs::path staging = ck::stage_checkpoint(dir, 8);
  ck::write_checkpoint_file(staging / ck::rank_file_name(0), r0, make_state(8), {0, 2, "tp=2 pp=1 dp=1"});
  ck::write_checkpoint_file(staging / ck::rank_file_name(1), r1, make_state(8), {1, 2, "tp=2 pp=1 dp=1"});
  const fs::path step_dir = ck::commit_checkpoint(dir, staging, 8, 0);
  EXPECT_TRUE(ck::verify_checkpoint(dir).empty()) << joined(ck::verify_checkpoint(dir));

  for (const std::string name : {"model/layers.0/attn/wqkv", "model/layers.0/attn/cmp_wk", "model/layers.0/attn_norm"}) {
    const auto t = ck::read_full_tensor(ck::checkpoint_files(step_dir), name);
    const auto w = P.weight(name);
    EXPECT_EQ(t.shape, w.shape());
    EXPECT_EQ(std::memcmp(t.data.data(), w.raw(), w.nbytes()), 0) << name;
  }
  // A single-process run resumes from the two-rank checkpoint, bit for bit.
  Model got = make_model(77);
  EXPECT_EQ(ck::load_checkpoint(dir, got.params, got.m, got.v), make_state(8));
  EXPECT_TRUE(same_bits(P.flat_weights(), got.params.flat_weights()));
  EXPECT_TRUE(same_bits(mo.m, got.m));
  EXPECT_TRUE(same_bits(mo.v, got.v));
}

TEST(Shards, AGapOrDisagreementIsAnError) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  std::vector<float> a(6, 1.0f), b(6, 2.0f);
  const fs::path staging = ck::stage_checkpoint(dir, 1);
  // "model/x" [4, 3]: rows 0-1 present, rows 2-3 missing. "model/y" [2, 3]: whole in both
  // files (replicas). "model/y_half" [3, 3]: rows 0-1 and rows 1-2, disagreeing on row 1.
  ck::write_checkpoint_file(staging / ck::rank_file_name(0),
                            {{"model/x", {4, 3}, {0, 0}, {2, 3}, a.data()},
                             {"model/y", {2, 3}, {0, 0}, {2, 3}, a.data()},
                             {"model/y_half", {3, 3}, {0, 0}, {2, 3}, a.data()}},
                            make_state(1), {0, 2});
  ck::write_checkpoint_file(staging / ck::rank_file_name(1),
                            {{"model/y", {2, 3}, {0, 0}, {2, 3}, b.data()},
                             {"model/y_half", {3, 3}, {1, 0}, {2, 3}, b.data()}},
                            make_state(1), {1, 2});
  ck::commit_checkpoint(dir, staging, 1, 0);
  const auto files = ck::checkpoint_files(dir / "step_00000001");
  expect_user_error([&] { ck::read_full_tensor(files, "model/x"); }, {"model/x", "6 of 12 elements uncovered"});
  expect_user_error([&] { ck::read_full_tensor(files, "model/y_half"); }, {"model/y_half", "different values"});
  EXPECT_EQ(ck::read_full_tensor(files, "model/y").data, a);
  expect_user_error([&] { ck::read_full_tensor(files, "model/zzz"); }, {"model/zzz", "no such tensor"});
  const auto problems = ck::verify_checkpoint(dir);
  EXPECT_TRUE(any_contains(problems, {"model/x", "6 of 12 elements are in no shard"})) << joined(problems);
  EXPECT_TRUE(any_contains(problems, {"optim/m/model/x", "missing"})) << joined(problems);
}
