// Tensor, pipeline and data parallelism on GPUs end to end: `mpirun -np N nsatron train` with
// one GPU per rank (NCCL for the activations and gradients) against the one-GPU run of
// the same config. In fp32 compute the loss, validation loss and gradient norm of each of 5
// steps agree to 1e-5 relative and every final weight and moment to 1e-5; in bf16 compute
// (the production setting: bf16 weights for the kernels, fp32 master weights) the runs agree
// to 1% (bf16 rounds the compute copy of weights that differ in their last fp32 bits).
//
// Skipped without CUDA or with fewer GPUs than ranks (label gpu; scripts/gpu_check.sh runs it
// on the GPU machine).
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "core/device/device.h"
#include "tests/parallel/parallel_train_fixture.h"

namespace {

const std::string kModel = " --set model.n_layers=4 --set model.n_kv_heads=4 --set model.n_heads=8";
const std::string kGpu = " --set train.device=cuda";
constexpr int kTensors = 4 * 11 + 2;

struct Layout {
  std::string name;
  int np;
  std::string settings;
};

class GpuTrain : public ParallelTrain {
 protected:
  // parallel.<key> ("pp_transport", "tp_transport"): each layout in fp32 and bf16 compute gives
  // the same bits with "nccl" and "copy_engine", and the log names each (nccl_log, copy_log).
  void expect_transports_give_the_same_bits(const std::string& key, const std::vector<Layout>& layouts,
                                            const std::string& nccl_log, const std::string& copy_log) {
    for (const std::string dtype : {"fp32", "bf16"})
      for (const Layout& l : layouts) {
        const std::string name = l.name + "_" + key + "_" + dtype;
        expect_same_bits(l.np, name, kModel + kGpu + " --set train.dtype=" + dtype + l.settings,
                         " --set parallel." + key + "=nccl", nccl_log, " --set parallel." + key + "=copy_engine",
                         copy_log, kTensors);
      }
  }
};

// A macro, not a function: GTEST_SKIP returns from the function it is written in.
// Several GPU ranks also need a build with NCCL (NSATRON_TEST_HAVE_NCCL, from CMake).
#define REQUIRE_GPUS(n)                                                                              \
  do {                                                                                               \
    if (!NSATRON_TEST_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL";                           \
    if (!nsatron::cuda_available() || nsatron::cuda_device_count() < (n))                            \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices; this machine has " << nsatron::cuda_device_count(); \
  } while (0)

TEST_F(GpuTrain, EveryLayoutMatchesOneGpuInFp32) {
  REQUIRE_GPUS(2);
  const std::string fp32 = kModel + kGpu + " --set train.dtype=fp32";
  ASSERT_EQ(train(0, "one", fp32).code, 0);
  std::vector<Layout> layouts = {{"dp2", 2, ""}, {"pp2", 2, " --set parallel.pp=2"},
                                 {"tp2", 2, " --set parallel.tp=2"},
                                 {"tp2_overlap", 2, " --set parallel.tp=2 --set parallel.tp_overlap=true"},
                                 {"tp2_pairs_joint", 2,
                                  " --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true --set "
                                  "parallel.tp_pair_core=joint"},
                                 {"tp2_pairs_joint_full_1", 2,
                                  " --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true --set "
                                  "parallel.tp_pair_core=joint --set recompute.policy=full --set recompute.layers=1"},
                                 {"tp2_overlap_selective", 2,
                                  " --set parallel.tp=2 --set parallel.tp_overlap=true --set recompute.policy=selective"},
                                 {"dp2_zero1", 2, " --set parallel.zero1=true"},
                                 {"pp2_v2", 2, " --set parallel.pp=2 --set parallel.virtual_stages=2"}};
  if (nsatron::cuda_device_count() >= 4)
    layouts.insert(layouts.end(), {{"dp4", 4, ""}, {"pp2_dp2", 4, " --set parallel.pp=2"},
                                   {"pp4", 4, " --set parallel.pp=4"}, {"tp4", 4, " --set parallel.tp=4"},
                                   {"tp2_pp2", 4, " --set parallel.tp=2 --set parallel.pp=2"},
                                   {"tp2_dp2", 4, " --set parallel.tp=2"}});
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    CommandResult r = train(l.np, l.name, fp32 + l.settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("activations and gradients over NCCL"), std::string::npos) << r.out;
    EXPECT_TRUE(ckpt::verify_checkpoint(dir_ / l.name).empty());
    expect_same_curve("one", l.name, 1e-5, 5);
    expect_same_tensors("one", l.name, 1e-5, kTensors);
  }
}

TEST_F(GpuTrain, EveryLayoutFollowsOneGpuInBf16) {
  REQUIRE_GPUS(2);
  const std::string bf16 = kModel + kGpu + " --set train.dtype=bf16";
  ASSERT_EQ(train(0, "one", bf16).code, 0);
  // (dp2 with ZeRO-1: the bf16 compute copy is refreshed after the weights' all-gather.)
  for (const Layout& l : {Layout{"dp2", 2, ""}, Layout{"pp2", 2, " --set parallel.pp=2"},
                          Layout{"tp2", 2, " --set parallel.tp=2"},
                          Layout{"tp2_overlap", 2, " --set parallel.tp=2 --set parallel.tp_overlap=true"},
                          Layout{"tp2_pairs_joint", 2,
                                 " --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true --set "
                                 "parallel.tp_pair_core=joint"},
                          Layout{"dp2_zero1", 2, " --set parallel.zero1=true"},
                          Layout{"pp2_v2", 2, " --set parallel.pp=2 --set parallel.virtual_stages=2"}}) {
    SCOPED_TRACE(l.name);
    CommandResult r = train(l.np, l.name, bf16 + l.settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    expect_same_curve("one", l.name, 1e-2, 5);
  }
}

// parallel.overlap_grad_reduce on GPUs: each bucket's all-reduce on the NCCL communicator's
// own stream, started in the last backward (hundreds of 1 KiB buckets) and waited for by the
// compute stream: the same bits as after the backward, with one and with two micro-batches
// per rank, in fp32 and in bf16 compute.
TEST_F(GpuTrain, OverlappedReductionGivesTheSameBits) {
  REQUIRE_GPUS(2);
  expect_overlap_same_bits(2, "dp2_fp32_a2", kModel + kGpu + " --set train.dtype=fp32", kTensors);
  expect_overlap_same_bits(2, "dp2_fp32_a1", kModel + kGpu + " --set train.dtype=fp32 --set train.global_batch=4",
                           kTensors);
  expect_overlap_same_bits(2, "dp2_bf16_a2", kModel + kGpu + " --set train.dtype=bf16", kTensors);
}

// parallel.tp_micro_batch_pairs on GPUs: the two micro-batches' sums on the NCCL communicator's
// stream, each waited for by the compute stream where the other micro-batch's half ends: the
// same bits as without, in fp32 and bf16 compute (tp2; two and three micro-batches per step),
// with a core call per micro-batch (tp_pair_core = "separate", the default, named; the joint
// cores are in the layout lists above, against one GPU).
TEST_F(GpuTrain, TensorParallelMicroBatchPairsGiveTheSameBits) {
  REQUIRE_GPUS(2);
  for (const std::string dtype : {"fp32", "bf16"})
    for (const std::string batch : {"", " --set train.global_batch=6"})
      expect_same_bits(2, "tp2_" + dtype + (batch.empty() ? "_a4" : "_a3"),
                       kModel + kGpu + " --set parallel.tp=2 --set train.dtype=" + dtype + batch, "",
                       "the forward's all-reduces in line",
                       " --set parallel.tp_micro_batch_pairs=true --set parallel.tp_pair_core=separate",
                       "(tp_micro_batch_pairs) on a communication stream, one attention core call per micro-batch",
                       kTensors);
}

// log.profile_step on GPU ranks: besides the op families, each group's communication busy
// time on the GPU (events around every collective and transfer on its stream), the compute
// stream's time in that group's scopes, and the fraction hidden; for dp2 with the overlapped
// reduction, tp2 with micro-batch pairs and pp2 on the copy engines.
TEST_F(GpuTrain, ProfileReportsTheCommunicationHidden) {
  REQUIRE_GPUS(2);
  const std::string base = kModel + kGpu + " --set train.dtype=bf16 --set log.profile_step=3";
  struct Case {
    std::string name;
    int np;
    std::string settings, group, scopes;
  };
  for (const Case& l :
       {Case{"dp2_overlap", 2, " --set parallel.overlap_grad_reduce=true", "dp", "dp all-reduce"},
        Case{"tp2_pairs", 2, " --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true", "tp", "tp all-reduce"},
        Case{"pp2", 2, " --set parallel.pp=2", "pp", "pp transfer"}}) {
    SCOPED_TRACE(l.name);
    CommandResult r = train(l.np, l.name, base + l.settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    const std::regex line("# +" + l.group + " communication: ([0-9.]+) ms busy on the GPU, ([0-9.]+) ms waited for "
                          "by the compute stream \\(" + l.scopes + "[^)]*\\): ([0-9]+)% hidden");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, line)) << r.out;
    EXPECT_GE(std::stod(m[1]), 0.0);  // (the test model's messages take microseconds: 0.0 ms)
    EXPECT_GE(std::stod(m[2]), 0.0);
    EXPECT_LE(std::stoi(m[3]), 100);
    // pp = 1: when the host had queued the step's work and when the device had done it (the
    // losses' read, which waits for it), in that order; a pipeline's host waits for its peers.
    const std::regex host("# +host: the forwards and backwards queued at ([0-9.]+) ms, the device done with them at "
                          "([0-9.]+) ms \\(([0-9.]+) ms ahead\\)");
    if (l.group == "pp") {
      EXPECT_FALSE(std::regex_search(r.out, m, host)) << r.out;
      continue;
    }
    ASSERT_TRUE(std::regex_search(r.out, m, host)) << r.out;
    EXPECT_GT(std::stod(m[1]), 0.0);
    EXPECT_GE(std::stod(m[2]), std::stod(m[1]));
    // ... and in every step's metrics record (train.steps = 5; the validation records have none).
    const std::vector<double> leads = field_values(metrics(l.name), "host_lead_ms");
    ASSERT_EQ(leads.size(), 5u) << metrics(l.name);
    for (double lead : leads) EXPECT_GE(lead, 0.0);
  }
}

// parallel.pp_transport: the pipeline's messages on the copy engines (CUDA IPC slots, stream
// memory operations; parallel/copy_engine_communicator.h) give the same bits as NCCL's send and
// receive, in 1F1B and the interleaved schedule, fp32 and bf16 compute; the log names each.
TEST_F(GpuTrain, PipelineTransportsGiveTheSameBits) {
  REQUIRE_GPUS(2);
  expect_transports_give_the_same_bits(
      "pp_transport",
      {{"pp2", 2, " --set parallel.pp=2"}, {"pp2_v2", 2, " --set parallel.pp=2 --set parallel.virtual_stages=2"}},
      "pipeline messages: NCCL send/recv", "pipeline messages: copy engines");
}

// parallel.tp_transport: the tensor-parallel sums on the copy engines (every rank's part in
// the others' slots, added in rank order; parallel/copy_engine_communicator.h) give the same
// bits as NCCL's all-reduce at tp = 2, with the forward's sums in line and with micro-batch
// pairs, fp32 and bf16 compute; the log names each.
TEST_F(GpuTrain, TensorParallelTransportsGiveTheSameBits) {
  REQUIRE_GPUS(2);
  expect_transports_give_the_same_bits(
      "tp_transport",
      {{"tp2", 2, " --set parallel.tp=2"},
       {"tp2_pairs", 2, " --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true"}},
      "tensor-parallel sums: NCCL all-reduce", "tensor-parallel sums: copy engines");
}

TEST_F(GpuTrain, CheckpointsMoveBetweenGpuLayouts) {
  REQUIRE_GPUS(2);
  const std::string ten = kModel + kGpu + " --set train.dtype=fp32 --set train.steps=10";
  ASSERT_EQ(train(0, "ref", ten).code, 0);
  // pp2 on two GPUs -> one GPU, and one GPU -> dp2 (stop at 5, resume to 10).
  stop_and_resume("ref", "pp2_to_1", ten, 2, " --set parallel.pp=2", 0, "", 1e-5, 0);
  stop_and_resume("ref", "one_to_dp2", ten, 0, "", 2, "", 1e-5, kTensors);
}

TEST_F(GpuTrain, TensorParallelCheckpointResumesOnOneGpu) {
  REQUIRE_GPUS(2);
  const std::string ten = kModel + kGpu + " --set train.dtype=fp32 --set train.steps=10";
  ASSERT_EQ(train(0, "ref", ten).code, 0);
  stop_and_resume("ref", "tp2_to_1", ten, 2, " --set parallel.tp=2", 0, "", 1e-5, kTensors);
}

// CPU and GPU runs write the same checkpoint format: a CPU run's checkpoint continues on a GPU
// (and back) on the CPU run's curve, to the precision the two devices' kernels agree (fp32
// compute on both; summation orders differ).
TEST_F(GpuTrain, CheckpointsMoveBetweenCpuAndGpu) {
  REQUIRE_GPUS(1);
  const std::string ten = kModel + " --set train.dtype=fp32 --set train.steps=10";
  ASSERT_EQ(train(0, "cpu_ref", ten).code, 0);
  stop_and_resume("cpu_ref", "cpu_to_gpu", ten, 0, "", 0, kGpu, 1e-4, 0);
  stop_and_resume("cpu_ref", "gpu_to_cpu", ten, 0, kGpu, 0, "", 1e-4, 0);
}

}  // namespace
