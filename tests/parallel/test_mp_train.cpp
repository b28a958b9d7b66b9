// Tensor- and pipeline-parallel training end to end: `mpirun -np N nsatron train` with tp, pp
// and dp combined, against the one-process run of the same config: the loss, validation loss
// and gradient norm at each of 5 steps to 1e-5 relative, and every final weight and AdamW
// moment to 1e-5; checkpoints written by one layout resumed on another, and sampled from.
//
// The model here has 4 layers and 4 KV groups of 2 query heads, so that tp = 4 and pp = 4
// both fit (the tiny model of train_fixture.h has 2 of each). Dense attention (model.attention
// = "dense") is sharded the same way, by KV group: its layouts match one rank too. The
// interleaved pipeline (parallel.virtual_stages = 2: two chunks of one layer per stage with
// pp = 2) matches one rank the same way, and bit for bit wherever the non-interleaved
// pipeline does (untied head, no clipping: no sum spans the stages).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <string>

#include "tests/parallel/parallel_train_fixture.h"

namespace {

const std::string kModel = " --set model.n_layers=4 --set model.n_kv_heads=4 --set model.n_heads=8";
constexpr int kTensors = 4 * 11 + 2;  // 4 layers, the embedding (tied head) and the final norm

using MpTrain = ParallelTrain;

struct Layout {
  std::string name;
  int np;
  std::string settings;
  std::string log_says;  // a phrase of the run's log that shows the layout ran
};

TEST_F(MpTrain, EveryLayoutMatchesOneRank) {
  ASSERT_EQ(train(0, "one", kModel).code, 0);
  const std::vector<Layout> layouts = {
      {"tp2", 2, " --set parallel.tp=2", "tp=2 pp=1 dp=1"},
      {"pp2", 2, " --set parallel.pp=2", "tp=1 pp=2 dp=1"},
      {"tp2_pp2", 4, " --set parallel.tp=2 --set parallel.pp=2", "tp=2 pp=2 dp=1"},
      {"tp2_dp2", 4, " --set parallel.tp=2", "tp=2 pp=1 dp=2"},
      {"pp2_dp2", 4, " --set parallel.pp=2", "tp=1 pp=2 dp=2"},
      {"pp4", 4, " --set parallel.pp=4", "stage layers [0, 1), [1, 2), [2, 3), [3, 4)"},
      {"tp4", 4, " --set parallel.tp=4", "per rank 1 KV group(s) with 2 query heads"},
      {"pp2_uneven", 2, " --set parallel.pp=2 --set parallel.pp_layers=[1,3]", "stage layers [0, 1), [1, 4)"},
      {"tp2_dp2_zero1", 4, " --set parallel.tp=2 --set parallel.zero1=true", "ZeRO-1"},
      {"pp2_dp2_zero1", 4, " --set parallel.pp=2 --set parallel.zero1=true", "ZeRO-1"},
      {"tp2_pp2_selective", 4, " --set parallel.tp=2 --set parallel.pp=2 --set recompute.policy=selective",
       "recompute    selective"},
      {"tp2_pp2_full", 4, " --set parallel.tp=2 --set parallel.pp=2 --set recompute.policy=full",
       "recompute    full"},
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    CommandResult r = train(l.np, l.name, kModel + l.settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(l.log_says), std::string::npos) << r.out;
    EXPECT_EQ(r.err, "");  // the other ranks are quiet
    EXPECT_TRUE(ckpt::verify_checkpoint(dir_ / l.name).empty());
    expect_same_curve("one", l.name, 1e-5, 5);
    expect_same_tensors("one", l.name, 1e-5, kTensors);
  }
}

// Virtual stages: pp2 with V = 2 (chunks [0, 1) + [2, 3) and [1, 2) + [3, 4)), pp2+dp2,
// tp2+pp2 and full recompute, against one rank. (global_batch 8, micro_batch 2: A = 4
// micro-batches with dp = 1, 2 with dp = 2: multiples of pp.)
// log.profile_step under mpirun: rank 0 prints the ranks' compute times (a collective every
// rank joins at the profiled step), and the run goes on to its end.
TEST_F(MpTrain, ProfileNamesTheFastestAndSlowestRank) {
  CommandResult r = train(2, "tp2_profile", kModel + " --set parallel.tp=2 --set log.profile_step=3");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# step 3: time per op family on rank 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ranks' compute (the families less communication): fastest rank "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("step      5/5"), std::string::npos) << r.out;
}

// log.trace: the profiled step's timeline of every rank in one Chrome trace-event file (pp2: a
// process per rank, each with its compute lane's scopes, among them the pipeline's transfers).
TEST_F(MpTrain, TraceHoldsEveryRanksTimeline) {
  const std::filesystem::path trace = dir_ / "trace" / "step3.json";
  CommandResult r = train(2, "pp2_trace", kModel + " --set parallel.pp=2 --set log.profile_step=3 --set log.trace=" +
                                              trace.string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("timeline of 2 rank(s) written to " + trace.string() + " (log.trace)"), std::string::npos)
      << r.out;
  const std::string text = read_file_text(trace.string());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\": \"ms\", \"otherData\": {\"step\": 3,", 0), 0u) << text.substr(0, 200);
  const std::regex span("\\{\"name\": \"([^\"]+)\", \"ph\": \"X\", \"pid\": ([0-9]+), \"tid\": 0, \"ts\": "
                        "(-?[0-9.e+-]+), \"dur\": ([0-9.e+-]+)\\}");
  std::map<int, int> spans;  // per rank
  std::map<int, double> last_start;
  bool transfers = false;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), span); it != std::sregex_iterator(); ++it) {
    const int rank = std::stoi((*it)[2]);
    const double ts = std::stod((*it)[3]), dur = std::stod((*it)[4]);
    EXPECT_GE(dur, 0.0);
    EXPECT_GE(ts, 0.0);  // from the rank's first scope
    // The compute lane's scopes in the order they ran (CPU ranks: one thread).
    if (last_start.count(rank)) {
      EXPECT_GE(ts, last_start[rank]);
    }
    last_start[rank] = ts;
    ++spans[rank];
    transfers = transfers || (*it)[1] == "pp transfer";
  }
  EXPECT_GT(spans[0], 0) << text.substr(0, 500);
  EXPECT_GT(spans[1], 0) << text.substr(0, 500);
  EXPECT_TRUE(transfers);
  EXPECT_NE(text.find("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": \"rank 1\"}}"),
            std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");
}

TEST_F(MpTrain, VirtualStagesMatchOneRank) {
  ASSERT_EQ(train(0, "one", kModel).code, 0);
  const std::string v2 = " --set parallel.pp=2 --set parallel.virtual_stages=2";
  const std::vector<Layout> layouts = {
      {"pp2_v2", 2, v2,
       "PP: interleaved 1F1B, 2 virtual stages (model chunks) per stage, over 4 micro-batches, stage layers "
       "[0, 1) + [2, 3), [1, 2) + [3, 4), tied embedding gradients summed between the first and last stages; bubble "
       "(pp - 1) / (V * A) = 1/8 = 12.5% of the step's ideal time"},
      {"pp2_dp2_v2", 4, v2, "tp=1 pp=2 dp=2"},
      {"tp2_pp2_v2", 4, " --set parallel.tp=2" + v2, "tp=2 pp=2 dp=1"},
      {"pp2_v2_full", 2, v2 + " --set recompute.policy=full --set recompute.layers=3", "recompute    full"},
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    CommandResult r = train(l.np, l.name, kModel + l.settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(l.log_says), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("interleaved 1F1B"), std::string::npos) << r.out;
    EXPECT_EQ(r.err, "");
    EXPECT_TRUE(ckpt::verify_checkpoint(dir_ / l.name).empty());
    expect_same_curve("one", l.name, 1e-5, 5);
    expect_same_tensors("one", l.name, 1e-5, kTensors);
  }
  // The bubble is printed without virtual stages too: (pp - 1) / A.
  CommandResult plain = train(2, "pp2", kModel + " --set parallel.pp=2");
  ASSERT_EQ(plain.code, 0) << plain.out << plain.err;
  EXPECT_NE(plain.out.find("PP: 1F1B over 4 micro-batches, stage layers [0, 2), [2, 4), tied embedding gradients "
                           "summed between the first and last stages; bubble (pp - 1) / A = 1/4 = 25.0% of the "
                           "step's ideal time"),
            std::string::npos)
      << plain.out;
}

// parallel.overlap_grad_reduce with tensor and pipeline parallelism: TP ranks report their
// shards' ranges; on a pipeline each stage reports its layers during the last micro-batch's
// backward, and the tied embedding (summed between the stages after the schedule) is reduced
// after the backward; the interleaved schedule reports each chunk's layers.
TEST_F(MpTrain, OverlappedReductionGivesTheSameBits) {
  expect_overlap_same_bits(4, "tp2_dp2", kModel + " --set parallel.tp=2", kTensors);
  expect_overlap_same_bits(4, "pp2_dp2", kModel + " --set parallel.pp=2", kTensors, false);
  expect_overlap_same_bits(4, "pp2_dp2_v2", kModel + " --set parallel.pp=2 --set parallel.virtual_stages=2", kTensors,
                           false);
  expect_overlap_same_bits(4, "pp2_dp2_untied", kModel + " --set parallel.pp=2 --set model.tie_embeddings=false",
                           kTensors + 1);
}

// Where nothing is summed across the stages in another order than one process sums it (an
// untied head: no embedding gradients to add between stages; no clipping: the gradient norm,
// added per stage, is only logged), pp2 gives the one-process bits, and so does pp2 with
// virtual stages: every loss and every final weight and moment, bit for bit.
TEST_F(MpTrain, VirtualStagesGiveTheBitsOfOneRank) {
  const std::string exact = kModel + " --set model.tie_embeddings=false --set optim.grad_clip=0";
  ASSERT_EQ(train(0, "one", exact).code, 0);
  for (const auto& [name, settings] : std::vector<std::pair<std::string, std::string>>{
           {"pp2", " --set parallel.pp=2"}, {"pp2_v2", " --set parallel.pp=2 --set parallel.virtual_stages=2"}}) {
    SCOPED_TRACE(name);
    CommandResult r = train(2, name, exact + settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(field_values(metrics(name), "loss"), field_values(metrics("one"), "loss"));
    EXPECT_EQ(field_values(metrics(name), "val_loss"), field_values(metrics("one"), "val_loss"));
    expect_same_tensors("one", name, 0, kTensors + 1);
  }
}

// Checkpoints move between pp2 and pp2 with virtual stages (the same global names, other
// ranks holding them), both ways, on the one-process curve.
TEST_F(MpTrain, CheckpointsMoveBetweenVirtualStageLayouts) {
  const std::string ten = kModel + " --set train.steps=10";
  ASSERT_EQ(train(0, "ref", ten).code, 0);
  const std::string pp2 = " --set parallel.pp=2", v2 = pp2 + " --set parallel.virtual_stages=2";
  stop_and_resume("ref", "pp2_to_pp2v2", ten, 2, pp2, 2, v2, 1e-5, kTensors);
  stop_and_resume("ref", "pp2v2_to_pp2", ten, 2, v2, 2, pp2, 1e-5, kTensors);
  stop_and_resume("ref", "pp2v2_to_1", ten, 2, v2, 0, "", 1e-5, kTensors);
}

// Configs the interleaved schedule cannot run are refused before any work, on every rank,
// with the config's FILE:LINE:COL: key: message (exit 2).
TEST_F(MpTrain, VirtualStagesRefuseLayoutsThatDoNotSplit) {
  const std::string v2 = " --set parallel.pp=2 --set parallel.virtual_stages=2";
  // 6 layers do not cut into pp * V = 4 chunks.
  CommandResult r = train(2, "bad_layers", kModel + v2 + " --set model.n_layers=6");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--set parallel.virtual_stages=2: parallel.virtual_stages: pp * virtual_stages = 2 * 2 = 4 must "
                       "divide n_layers = 6"),
            std::string::npos)
      << r.err;
  // global_batch 6 = 3 micro-batches of 2: not a multiple of pp.
  r = train(2, "bad_batch", kModel + v2 + " --set train.global_batch=6");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("train.global_batch: global_batch = 6 gives A = global_batch / (micro_batch * dp) = 6 / (2 * 1) "
                       "= 3 micro-batches per step, not a multiple of pp = 2"),
            std::string::npos)
      << r.err;
  // pp_layers with one entry per stage instead of per chunk: both keys named.
  r = train(2, "bad_split", kModel + v2 + " --set parallel.pp_layers=[1,3]");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("parallel.pp_layers: has 2 entries but pp * virtual_stages = 2 * 2 = 4 (one entry per model "
                       "chunk"),
            std::string::npos)
      << r.err;
}

// Virtual stages with uneven chunks (parallel.pp_layers, one entry per chunk): 6 layers as
// chunks of 2, 1, 2, 1 (stage 0 holds layers 0-1 and 3-4, stage 1 layers 2 and 5), alone and
// with data parallelism, on the one-process curve.
TEST_F(MpTrain, UnevenVirtualStagesMatchOneRank) {
  const std::string six = kModel + " --set model.n_layers=6";
  constexpr int kSixTensors = 6 * 11 + 2;
  ASSERT_EQ(train(0, "one", six).code, 0);
  const std::string v2 = " --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.pp_layers=[2,1,2,1]";
  for (const Layout& l : {Layout{"pp2_v2_uneven", 2, v2, "stage layers [0, 2) + [3, 5), [2, 3) + [5, 6)"},
                          Layout{"pp2_v2_uneven_dp2", 4, v2, "stage layers [0, 2) + [3, 5), [2, 3) + [5, 6)"}}) {
    SCOPED_TRACE(l.name);
    CommandResult r = train(l.np, l.name, six + l.settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(l.log_says), std::string::npos) << r.out;
    expect_same_curve("one", l.name, 1e-5, 5);
    expect_same_tensors("one", l.name, 1e-5, kSixTensors);
  }
}

TEST_F(MpTrain, DenseAttentionUnderTensorAndPipelineParallelism) {
  const std::string dense = kModel + " --set model.attention=dense";
  constexpr int kDenseTensors = 4 * 7 + 2;  // no compression maps
  ASSERT_EQ(train(0, "one", dense).code, 0);
  const std::vector<Layout> layouts = {
      {"tp4", 4, " --set parallel.tp=4", "per rank 1 KV group(s) with 2 query heads"},
      {"tp2_pp2_selective", 4, " --set parallel.tp=2 --set parallel.pp=2 --set recompute.policy=selective",
       "recompute    selective"},
      {"pp2_dp2_full", 4, " --set parallel.pp=2 --set recompute.policy=full", "recompute    full"},
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    CommandResult r = train(l.np, l.name, dense + l.settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(l.log_says), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("attention    dense: CPU reference"), std::string::npos) << r.out;
    expect_same_curve("one", l.name, 1e-5, 5);
    expect_same_tensors("one", l.name, 1e-5, kDenseTensors);
  }
  const std::string ten = dense + " --set train.steps=10";
  ASSERT_EQ(train(0, "ref", ten).code, 0);
  stop_and_resume("ref", "tp2pp2_to_1", ten, 4, " --set parallel.tp=2 --set parallel.pp=2", 0, "", 1e-5, kDenseTensors);
}

// parallel.tp_overlap: each layer's ops around the core in two halves of the micro-batch (the
// core over both), each half's TP sums waited for only where the next half ends (MPI_Iallreduce here:
// a sum read before its wait would be one rank's share). NSA and dense attention, with
// pipeline stages, data parallelism and the three recompute policies, against one rank; and a
// checkpoint written with it resumed without it.
TEST_F(MpTrain, TensorParallelOverlapMatchesOneRank) {
  const std::string on = " --set parallel.tp_overlap=true";
  for (const std::string attention : {"nsa", "dense"}) {
    const std::string model = kModel + " --set model.attention=" + attention;
    const int tensors = attention == "nsa" ? kTensors : 4 * 7 + 2;
    ASSERT_EQ(train(0, "one_" + attention, model).code, 0);
    const std::vector<Layout> layouts = {
        {"tp2", 2, " --set parallel.tp=2" + on, "tp=2 pp=1 dp=1"},
        {"tp2_pp2_selective", 4, " --set parallel.tp=2 --set parallel.pp=2 --set recompute.policy=selective" + on,
         "recompute    selective"},
        {"tp2_dp2_full", 4, " --set parallel.tp=2 --set recompute.policy=full --set recompute.layers=2" + on,
         "recompute    full"},
        {"tp4", 4, " --set parallel.tp=4" + on, "per rank 1 KV group(s) with 2 query heads"},
    };
    for (const Layout& l : layouts) {
      const std::string name = l.name + "_" + attention;
      SCOPED_TRACE(name);
      CommandResult r = train(l.np, name, model + l.settings);
      ASSERT_EQ(r.code, 0) << r.out << r.err;
      EXPECT_NE(r.out.find(l.log_says), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("two halves of the micro-batch, one half's all-reduces beside the other's compute "
                           "(tp_overlap)"),
                std::string::npos)
          << r.out;
      EXPECT_EQ(r.err, "");
      expect_same_curve("one_" + attention, name, 1e-5, 5);
      expect_same_tensors("one_" + attention, name, 1e-5, tensors);
    }
  }
  // Uneven parts: micro-batches of 3 sequences (1 and 2).
  const std::string three = kModel + " --set train.micro_batch=3 --set train.global_batch=6";
  ASSERT_EQ(train(0, "one_b3", three).code, 0);
  CommandResult r = train(2, "tp2_b3", three + " --set parallel.tp=2" + on);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  expect_same_curve("one_b3", "tp2_b3", 1e-5, 5);
  expect_same_tensors("one_b3", "tp2_b3", 1e-5, kTensors);
  const std::string ten = kModel + " --set train.steps=10";
  ASSERT_EQ(train(0, "ref", ten).code, 0);
  stop_and_resume("ref", "tp2_overlap_to_1", ten, 2, " --set parallel.tp=2" + on, 0, "", 1e-5, kTensors);
}

// parallel.tp_micro_batch_pairs: two micro-batches' forwards and backwards layer by layer in
// turn, each row-parallel output's and input gradient's sum (MPI_Iallreduce here) waited for
// only where the other micro-batch's half or phase ends. The same operations and gradient
// order as without (a tied embedding's lookups deferred in both): the same bits, for NSA and
// dense attention, with full recompute, with data parallelism and its gradient hook on the
// step's last micro-batch (the second of a pair, armed for each of its phases), with an odd
// number of micro-batches per step (the last alone), and with an untied head.
TEST_F(MpTrain, TensorParallelMicroBatchPairsGiveTheSameBits) {
  const std::string on = " --set parallel.tp_micro_batch_pairs=true";
  const std::string three = " --set train.global_batch=6";  // 3 micro-batches of 2
  struct Case {
    std::string name;
    int np;
    std::string settings;
    int tensors;
  };
  const std::string dense = kModel + " --set model.attention=dense";
  for (const Case& c : {Case{"tp2_nsa", 2, kModel + " --set parallel.tp=2", kTensors},
                        Case{"tp2_dense_full", 2, dense + " --set parallel.tp=2 --set recompute.policy=full", 4 * 7 + 2},
                        Case{"tp2_dp2_overlap", 4,
                             kModel + " --set parallel.tp=2 --set parallel.overlap_grad_reduce=true "
                                      "--set parallel.grad_bucket_kib=1",
                             kTensors},
                        Case{"tp2_odd", 2, kModel + " --set parallel.tp=2" + three, kTensors},
                        Case{"tp2_untied", 2, kModel + " --set parallel.tp=2 --set model.tie_embeddings=false",
                             kTensors + 1}}) {
    expect_same_bits(c.np, c.name, c.settings, "", "the forward's all-reduces in line", on,
                     "micro-batches two at a time, their forwards and backwards layer by layer in turn, one's "
                     "all-reduces beside the other's compute (tp_micro_batch_pairs)",
                     c.tensors);
  }
  // Not with a pipeline, nor with tp_overlap.
  CommandResult r = train(4, "pairs_pp2", kModel + " --set parallel.tp=2 --set parallel.pp=2" + on);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("parallel.tp_micro_batch_pairs: tp_micro_batch_pairs runs the whole model's forward for two "
                       "micro-batches in turn and is built for pp = 1 (it is 2"),
            std::string::npos)
      << r.err;
  r = train(2, "pairs_overlap", kModel + " --set parallel.tp=2 --set parallel.tp_overlap=true" + on);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("tp_micro_batch_pairs and tp_overlap are two ways to hide the TP all-reduces"),
            std::string::npos)
      << r.err;
}

TEST_F(MpTrain, UntiedHeadUnderTensorAndPipelineParallelism) {
  const std::string untied = kModel + " --set model.tie_embeddings=false";
  ASSERT_EQ(train(0, "one", untied).code, 0);
  CommandResult r = train(4, "tp2_pp2", untied + " --set parallel.tp=2 --set parallel.pp=2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  expect_same_curve("one", "tp2_pp2", 1e-5, 5);
  expect_same_tensors("one", "tp2_pp2", 1e-5, kTensors + 1);
}

TEST_F(MpTrain, ShardedCheckpointHoldsEachBlockOnce) {
  CommandResult r = train(4, "tp2_pp2", kModel + " --set parallel.tp=2 --set parallel.pp=2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // Each (tp_rank, pp_rank) writes its blocks: four files, and every tensor assembles whole.
  const auto files = ckpt::checkpoint_files(ckpt::resolve_checkpoint(dir_ / "tp2_pp2"));
  EXPECT_EQ(files.size(), 4u);
  int tensors = 0;
  ckpt::for_each_tensor(dir_ / "tp2_pp2", [&](const std::string& name, const ckpt::FullTensor& t) {
    if (name == "model/embedding") {
      EXPECT_EQ(t.shape, (nsatron::Shape{256, 32}));
    }
    if (name == "model/layers.3/attn/wo") {
      EXPECT_EQ(t.shape, (nsatron::Shape{32, 64}));
    }
    ++tensors;
  });
  EXPECT_EQ(tensors, 3 * kTensors);
  // One process samples from it (the stored config's layout does not bind the sampler).
  CommandResult sample = run_nsatron("sample --checkpoint " + (dir_ / "tp2_pp2").string() + " --prompt 'the ' --tokens 8");
  EXPECT_EQ(sample.code, 0) << sample.err;
  EXPECT_EQ(sample.out.rfind("the ", 0), 0u) << sample.out;
}

TEST_F(MpTrain, CheckpointsReshardBetweenLayouts) {
  const std::string ten = kModel + " --set train.steps=10";
  ASSERT_EQ(train(0, "ref", ten).code, 0);
  const std::string tp2pp2 = " --set parallel.tp=2 --set parallel.pp=2";
  stop_and_resume("ref", "tp2pp2_to_1", ten, 4, tp2pp2, 0, "", 1e-5, kTensors);
  stop_and_resume("ref", "one_to_tp2pp2", ten, 0, "", 4, tp2pp2, 1e-5, kTensors);
  stop_and_resume("ref", "tp2_to_pp2", ten, 2, " --set parallel.tp=2", 2, " --set parallel.pp=2", 1e-5, kTensors);
  stop_and_resume("ref", "zero1_tp2dp2_to_pp2", ten, 4, " --set parallel.tp=2 --set parallel.zero1=true", 2,
                  " --set parallel.pp=2", 1e-5, kTensors);
}

// A pipeline stage holds some of the model's tensors, yet a checkpoint of a deeper model is
// refused, as it is for one process: the stage checks the checkpoint against the whole
// model's names.
TEST_F(MpTrain, AStageRefusesACheckpointOfAnotherModel) {
  ASSERT_EQ(train(0, "deep", kModel + " --set train.steps=2").code, 0);
  const std::string shallow = " --set model.n_layers=2 --set model.n_kv_heads=4 --set model.n_heads=8";
  for (int np : {0, 2}) {
    CommandResult r = train(np, "deep", shallow + " --set train.steps=4" + (np ? " --set parallel.pp=2" : ""));
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("model/layers.3/attn/wqkv: in the checkpoint but not in the config's model"),
              std::string::npos)
        << r.err;
  }
}

}  // namespace
