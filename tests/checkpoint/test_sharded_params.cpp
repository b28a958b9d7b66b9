// Checkpoints of sharded models: a ParamStore holding blocks of tensors (tensor parallelism)
// or some of the tensors (a pipeline stage) loads from a whole-model checkpoint, and ranks
// holding blocks write, through param_shards, a checkpoint that loads whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "checkpoint/checkpoint.h"
#include "ckpt_test_util.h"
#include "core/util/error.h"

using namespace ckpt_test;
namespace ck = nsatron::checkpoint;
using nsatron::ParamInfo;
using nsatron::Shape;
using nsatron::ShardPlacement;
using nsatron::UserError;

namespace {


// One parameter of a rank's store: its block (shape) and where it sits in the full tensor.
struct Block {
  std::string name;
  Shape shape;
  ShardPlacement place;  // empty: whole
};

// A store of blocks whose weights and moments hold garbage (NaN), to be overwritten.
Model make_block_model(const std::vector<Block>& blocks) {
  Model mo;
  for (const auto& b : blocks) mo.params.declare(b.name, b.shape, true, 0.02, false, b.place);
  mo.params.allocate(nsatron::DType::F32);
  mo.m = nsatron::Tensor::zeros({mo.params.total()}, nsatron::DType::F32);
  mo.v = nsatron::Tensor::zeros({mo.params.total()}, nsatron::DType::F32);
  for (nsatron::Tensor* t : {&mo.params.flat_weights(), &mo.m, &mo.v})
    std::fill_n(t->data<float>(), t->numel(), std::numeric_limits<float>::quiet_NaN());
  return mo;
}

// The block `p` (a parameter of another store) of the full tensor `name` of `whole`:
// which = 0 the weights, 1 the first moment, 2 the second.
std::vector<float> block_of(const Model& whole, int which, const ParamInfo& p) {
  const ParamInfo& w = whole.params.info(p.name);
  EXPECT_EQ(w.shape, p.global_shape) << p.name;
  const nsatron::Tensor& flat = which == 0 ? whole.params.flat_weights() : which == 1 ? whole.m : whole.v;
  std::vector<float> out(std::size_t(p.numel));
  nsatron::extract_box(flat.data<float>() + w.offset, p.global_shape, p.global_offset, p.shape, out.data());
  return out;
}

// Every parameter of `part` (weights, and moments unless weights_only) equals its block of
// `whole`, bit for bit.
void expect_blocks_of(const Model& whole, const Model& part, bool weights_only = false) {
  for (const auto& p : part.params.infos())
    for (int which = 0; which < (weights_only ? 1 : 3); ++which) {
      const std::vector<float> want = block_of(whole, which, p);
      const nsatron::Tensor& flat = which == 0 ? part.params.flat_weights() : which == 1 ? part.m : part.v;
      EXPECT_EQ(std::memcmp(flat.data<float>() + p.offset, want.data(), want.size() * sizeof(float)), 0)
          << p.name << " (" << (which == 0 ? "weights" : which == 1 ? "m" : "v") << ")";
    }
}

ShardPlacement at(Shape global, Shape offset, bool replica = false) { return {std::move(global), std::move(offset), replica}; }

}  // namespace

TEST(ShardedLoad, BlocksOfAWholeCheckpoint) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model a = make_model(11);  // embedding [16, 8], attn_norm [8], wqkv [24, 8], cmp_wk [2, 12, 4], w_in [10, 8], final_norm [8]
  ck::save_checkpoint(dir, a.params, a.m, a.v, make_state(3), 0);

  // A tensor-parallel rank: rows of the embedding and of wqkv, columns of w_in, a middle block
  // of the 3-D cmp_wk, a replica of a norm gain, one whole tensor.
  const std::vector<Block> blocks = {
      {"model/embedding", {8, 8}, at({16, 8}, {8, 0})},
      {"model/layers.0/attn_norm", {8}, at({8}, {0}, /*replica=*/true)},
      {"model/layers.0/attn/wqkv", {8, 8}, at({24, 8}, {8, 0})},
      {"model/layers.0/attn/cmp_wk", {1, 6, 2}, at({2, 12, 4}, {1, 3, 1})},
      {"model/layers.1/mlp/w_in", {10, 3}, at({10, 8}, {0, 5})},
      {"model/final_norm", {8}, {}},
  };
  Model b = make_block_model(blocks);
  ASSERT_FALSE(nsatron::is_whole(b.params.info("model/layers.0/attn/cmp_wk")));
  EXPECT_EQ(ck::load_checkpoint(dir, b.params, b.m, b.v), make_state(3));
  expect_blocks_of(a, b);

  // The blocks are those a sharded model starts from: initialize() gives the same block.
  Model init = make_block_model(blocks);
  init.params.initialize(11);
  EXPECT_TRUE(same_bits(init.params.flat_weights(), b.params.flat_weights()));

  // Weights only.
  Model c = make_block_model(blocks);
  ck::load_weights(dir, c.params);
  expect_blocks_of(a, c, /*weights_only=*/true);
}

TEST(ShardedLoad, APartialStoreLoadsItsTensorsOnlyWithThePartialScope) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model a = make_model(12);
  ck::save_checkpoint(dir, a.params, a.m, a.v, make_state(4), 0);

  // A pipeline stage holding layer 0 (with a column block of wqkv) and the final norm.
  const std::vector<Block> stage = {
      {"model/layers.0/attn_norm", {8}, {}},
      {"model/layers.0/attn/wqkv", {24, 4}, at({24, 8}, {0, 4})},
      {"model/layers.0/attn/cmp_wk", {2, 12, 4}, {}},
      {"model/final_norm", {8}, {}},
  };
  Model s = make_block_model(stage);
  EXPECT_EQ(ck::load_checkpoint(dir, s.params, s.m, s.v, ck::LoadScope::part_of()), make_state(4));
  expect_blocks_of(a, s);
  Model w = make_block_model(stage);
  ck::load_weights(dir, w.params, ck::LoadScope::part_of());
  expect_blocks_of(a, w, /*weights_only=*/true);

  // For a whole model the checkpoint's other tensors are still an error.
  Model s2 = make_block_model(stage);
  expect_user_error([&] { ck::load_checkpoint(dir, s2.params, s2.m, s2.v); },
                    {"does not match the model", "model/embedding: in the checkpoint but not in the config's model",
                     "optim/m/model/layers.1/mlp/w_in: in the checkpoint but not in the config's model"});
  expect_user_error([&] { ck::load_weights(dir, s2.params, ck::LoadScope::whole_model()); },
                    {"model/layers.1/mlp/w_in: in the checkpoint but not in the config's model"});

  // Given the whole model's names, a partial scope refuses a checkpoint tensor outside them.
  std::vector<std::string> names;
  for (const auto& p : a.params.infos())
    if (p.name != "model/embedding") names.push_back(p.name);
  Model s4 = make_block_model(stage);
  expect_user_error([&] { ck::load_checkpoint(dir, s4.params, s4.m, s4.v, ck::LoadScope::part_of(names)); },
                    {"model/embedding: in the checkpoint but not in the config's model",
                     "optim/v/model/embedding: in the checkpoint but not in the config's model"});
  names.push_back("model/embedding");
  Model s5 = make_block_model(stage);
  EXPECT_EQ(ck::load_checkpoint(dir, s5.params, s5.m, s5.v, ck::LoadScope::part_of(names)), make_state(4));

  // The partial scope still wants every tensor of the store.
  auto more = stage;
  more.push_back({"model/layers.2/mlp/w_in", {10, 8}, {}});
  Model s3 = make_block_model(more);
  expect_user_error([&] { ck::load_checkpoint(dir, s3.params, s3.m, s3.v, ck::LoadScope::part_of()); },
                    {"model/layers.2/mlp/w_in: in the config's model but not in the checkpoint"});
}

TEST(ShardedLoad, ShapeMismatchIsAgainstTheGlobalShape) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model a = make_model(13);
  ck::save_checkpoint(dir, a.params, a.m, a.v, make_state(5), 0);
  // The block [8, 8] fits the checkpoint's [24, 8], but the config's full tensor is [32, 8].
  Model b = make_block_model({{"model/layers.0/attn/wqkv", {8, 8}, at({32, 8}, {8, 0})}});
  const std::string msg = expect_user_error(
      [&] { ck::load_checkpoint(dir, b.params, b.m, b.v, ck::LoadScope::part_of()); },
      {"model/layers.0/attn/wqkv: checkpoint shape [24, 8] but the config gives [32, 8]",
       "optim/m/model/layers.0/attn/wqkv: checkpoint shape [24, 8] but the config gives [32, 8]"});
  EXPECT_EQ(msg.find("model/embedding"), std::string::npos) << msg;  // partial: the others are no problem
}

TEST(ShardedSave, TwoRanksOfColumnBlocksLoadWhole) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model a = make_model(14);

  // Rank r holds the columns (last dimension) [r * n / 2, (r + 1) * n / 2) of every tensor of
  // two or more dimensions; the 1-D norm gains whole on rank 0 and as replicas on rank 1.
  Model ranks[2];
  std::vector<ck::ShardSpec> shards[2];
  for (int r = 0; r < 2; ++r) {
    std::vector<Block> blocks;
    for (const auto& p : a.params.infos()) {
      if (p.shape.size() == 1) {
        blocks.push_back({p.name, p.shape, at(p.shape, {0}, /*replica=*/r == 1)});
        continue;
      }
      Shape shape = p.shape, offset(p.shape.size(), 0);
      shape.back() = p.shape.back() / 2;
      offset.back() = r * shape.back();
      blocks.push_back({p.name, shape, at(p.shape, offset)});
    }
    ranks[r] = make_block_model(blocks);
    // Each rank's weights and moments: its blocks of the whole model's.
    Model& mo = ranks[r];
    for (const auto& p : mo.params.infos())
      for (int which = 0; which < 3; ++which) {
        const auto want = block_of(a, which, p);
        nsatron::Tensor& flat = which == 0 ? mo.params.flat_weights() : which == 1 ? mo.m : mo.v;
        std::memcpy(flat.data<float>() + p.offset, want.data(), want.size() * sizeof(float));
      }
    shards[r] = ck::param_shards(mo.params, mo.params.flat_weights().data<float>(), mo.m.data<float>(),
                                 mo.v.data<float>(), 0, 0, mo.params.total());
  }
  // The replicas are not written; the rest is, weights first, then m, then v.
  EXPECT_EQ(shards[0].size(), 3 * a.params.infos().size());
  EXPECT_EQ(shards[1].size(), 3 * (a.params.infos().size() - 2));
  for (const auto& s : shards[1]) EXPECT_EQ(s.name.find("norm"), std::string::npos) << s.name;
  const auto& wq = shards[1][1];  // rank 1's wqkv: columns 4-7 of [24, 8]
  EXPECT_EQ(wq.name, "model/layers.0/attn/wqkv");
  EXPECT_EQ(wq.global_shape, (Shape{24, 8}));
  EXPECT_EQ(wq.offset, (Shape{0, 4}));
  EXPECT_EQ(wq.shape, (Shape{24, 4}));
  EXPECT_EQ(shards[1][a.params.infos().size() - 2].name, "optim/m/model/embedding");
  EXPECT_EQ(shards[1].back().name, "optim/v/model/layers.1/mlp/w_in");

  const fs::path staging = ck::stage_checkpoint(dir, 9);
  for (int r = 0; r < 2; ++r)
    ck::write_checkpoint_file(staging / ck::rank_file_name(r), shards[r], make_state(9), {r, 2, "tp=2 pp=1 dp=1"});
  ck::commit_checkpoint(dir, staging, 9, 0);
  EXPECT_TRUE(ck::verify_checkpoint(dir).empty()) << joined(ck::verify_checkpoint(dir));

  Model got = make_model(99);
  EXPECT_EQ(ck::load_checkpoint(dir, got.params, got.m, got.v), make_state(9));
  EXPECT_TRUE(same_bits(a.params.flat_weights(), got.params.flat_weights()));
  EXPECT_TRUE(same_bits(a.m, got.m));
  EXPECT_TRUE(same_bits(a.v, got.v));

  // And back into the blocks of either rank.
  for (int r = 0; r < 2; ++r) {
    std::vector<Block> blocks;
    for (const auto& p : ranks[r].params.infos())
      blocks.push_back({p.name, p.shape, at(p.global_shape, p.global_offset, p.replica)});
    Model back = make_block_model(blocks);
    ck::load_checkpoint(dir, back.params, back.m, back.v);
    EXPECT_TRUE(same_bits(ranks[r].params.flat_weights(), back.params.flat_weights())) << "rank " << r;
    EXPECT_TRUE(same_bits(ranks[r].m, back.m)) << "rank " << r;
    EXPECT_TRUE(same_bits(ranks[r].v, back.v)) << "rank " << r;
  }
}

TEST(ShardedSave, Zero1RangesWithMomentsOfTheRangeOnly) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model a = make_model(15);
  const auto& infos = a.params.infos();
  // Two data-parallel ranks, each owning whole tensors: [0, split) and [split, total); each
  // keeps only its range's moments.
  const std::int64_t split = infos[3].offset, total = a.params.total();
  const float* w = a.params.flat_weights().data<float>();
  std::vector<float> m1(a.m.data<float>() + split, a.m.data<float>() + total);
  std::vector<float> v1(a.v.data<float>() + split, a.v.data<float>() + total);
  const auto r0 = ck::param_shards(a.params, w, a.m.data<float>(), a.v.data<float>(), 0, 0, split);
  const auto r1 = ck::param_shards(a.params, w, m1.data(), v1.data(), split, split, total);
  EXPECT_EQ(r0.size(), 3u * 3);
  EXPECT_EQ(r1.size(), 3u * (infos.size() - 3));
  EXPECT_EQ(r1.front().name, infos[3].name);
  EXPECT_EQ(r1[infos.size() - 3].data, m1.data());

  const fs::path staging = ck::stage_checkpoint(dir, 2);
  ck::write_checkpoint_file(staging / ck::rank_file_name(0), r0, make_state(2), {0, 2, "tp=1 pp=1 dp=2 zero1"});
  ck::write_checkpoint_file(staging / ck::rank_file_name(1), r1, make_state(2), {1, 2, "tp=1 pp=1 dp=2 zero1"});
  ck::commit_checkpoint(dir, staging, 2, 0);
  Model got = make_model(98);
  ck::load_checkpoint(dir, got.params, got.m, got.v);
  EXPECT_TRUE(same_bits(a.params.flat_weights(), got.params.flat_weights()));
  EXPECT_TRUE(same_bits(a.m, got.m));
  EXPECT_TRUE(same_bits(a.v, got.v));

  // Weights only; and a range that cuts a tensor, or leaves the buffers, is refused.
  EXPECT_EQ(ck::param_shards(a.params, w, nullptr, nullptr, 0, 0, total).size(), infos.size());
  EXPECT_THROW(ck::param_shards(a.params, w, nullptr, nullptr, 0, 0, split + 1), std::invalid_argument);
  EXPECT_THROW(ck::param_shards(a.params, w, nullptr, nullptr, 0, 0, total + 1), std::invalid_argument);
  EXPECT_THROW(ck::param_shards(a.params, w, m1.data(), v1.data(), split, 0, total), std::invalid_argument);
}
