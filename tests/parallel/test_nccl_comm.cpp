// The NCCL communicator (nccl_communicator.h), bind_local_gpu (gpu_binding.h) and
// make_device_groups (process_groups.h), under mpirun with 2 and 4 ranks, one GPU each
// (labels gpu and mpi). Every test binds the GPU first and skips, on every rank alike, when
// the build has no CUDA or NCCL, or the machine has no GPU for each rank. Values are small
// integers, exact in bf16, so every result is checked exactly, and on every rank the same
// bits.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/util/error.h"
#include "parallel/gpu_binding.h"
#include "parallel/layout.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"
#include "parallel/process_groups.h"
#include "tests/parallel/gpu_test_util.h"

using namespace nsatron;
using namespace nsatron::parallel;

namespace {


// A CUDA tensor holding `v` (converted to dt).
Tensor on_gpu(const std::vector<double>& v, DType dt) {
  return Tensor::from_vector(v, {std::int64_t(v.size())}, dt).to(Device::CUDA);
}

// True when `t` holds the same values on every rank (compared as the doubles every fp32 and
// bf16 value is exactly, over the host communicator).
bool same_bits_everywhere(MpiCommunicator& host, const Tensor& t) {
  const std::vector<double> v = t.to_vector();
  const std::int64_t n = std::int64_t(v.size());
  Tensor mine = Tensor::from_vector(v, {n}, DType::F64);
  Tensor all = Tensor::empty({n * host.size()}, DType::F64);
  host.all_gather(mine, all);
  const char* p = static_cast<const char*>(all.raw());
  for (int r = 1; r < host.size(); ++r)
    if (std::memcmp(p, p + mine.nbytes() * std::size_t(r), mine.nbytes()) != 0) return false;
  return true;
}

// "" when t's values are want(i) for every i, else the first difference. (Checks never
// return early from a test: every rank must make the same collective calls.)
template <class F> std::string mismatch(const Tensor& t, F want) {
  const std::vector<double> v = t.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != want(std::int64_t(i)))
      return "element " + std::to_string(i) + ": " + std::to_string(v[i]) + ", expected " +
             std::to_string(want(std::int64_t(i))) + " (" + std::string(dtype_name(t.dtype())) + ")";
  return "";
}

constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F64};

}  // namespace

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!host_) host_ = MpiCommunicator::world("world");
    const std::string why = gpu_skip_reason(*host_);
    if (!why.empty()) GTEST_SKIP() << why;
#if NSATRON_WITH_NCCL
    if (!comm_) comm_ = NcclCommunicator::create(*host_, "world");
#endif
  }
  // Destroyed together on every rank, after the suite (NCCL's destroy may wait for the peers).
  static void TearDownTestSuite() {
    comm_.reset();
    host_.reset();
  }
  int rank() const { return host_->rank(); }
  int size() const { return host_->size(); }
  static inline std::unique_ptr<MpiCommunicator> host_;
  static inline std::shared_ptr<Communicator> comm_;  // NCCL over the whole world
};

TEST_F(Nccl, RankSizeBackendAndDevice) {
  EXPECT_EQ(comm_->rank(), rank());
  EXPECT_EQ(comm_->size(), size());
  EXPECT_EQ(comm_->name(), "world");
  EXPECT_EQ(comm_->backend(), "nccl");
  for (DType dt : kDTypes) {
    EXPECT_TRUE(comm_->supports(dt, Device::CUDA));
    EXPECT_FALSE(comm_->supports(dt, Device::CPU));
  }
  Tensor cpu = Tensor::zeros({4}, DType::F32);
  EXPECT_THROW(comm_->all_reduce(cpu), std::logic_error);  // refused before any collective
#if NSATRON_WITH_NCCL
  // bind_local_gpu gives the ranks of one node different devices; the communicator runs on
  // the bound one.
  const int device = bind_local_gpu(*host_);
  EXPECT_EQ(static_cast<NcclCommunicator&>(*comm_).device(), device);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  std::vector<int> devices(static_cast<std::size_t>(node_size));
  MPI_Allgather(&device, 1, MPI_INT, devices.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  for (std::size_t i = 0; i < devices.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(devices[i], devices[j]) << "two ranks on one GPU";
#endif
}

TEST_F(Nccl, AllReduceSumAndMax) {
  const int n = size(), r = rank();
  for (DType dt : kDTypes)
    for (std::int64_t len : {std::int64_t(1), std::int64_t(1000), std::int64_t(1) << 20}) {
      std::vector<double> v(static_cast<std::size_t>(len));
      for (std::int64_t i = 0; i < len; ++i) v[std::size_t(i)] = double(r + 1) + double(i % 17);
      Tensor s = on_gpu(v, dt), m = on_gpu(v, dt);
      comm_->all_reduce(s, ReduceOp::Sum);
      comm_->all_reduce(m, ReduceOp::Max);
      EXPECT_EQ(mismatch(s, [&](std::int64_t i) { return double(n * (n + 1) / 2) + double(n) * double(i % 17); }), "");
      EXPECT_EQ(mismatch(m, [&](std::int64_t i) { return double(n) + double(i % 17); }), "");
      EXPECT_TRUE(same_bits_everywhere(*host_, s));
    }
  // Inexact sums (random fp32) still give the same bits on every rank.
  std::mt19937_64 g(std::uint64_t(1234 + r));
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v((std::size_t(1) << 20) + 5);
  for (auto& x : v) x = d(g);
  Tensor t = on_gpu(v, DType::F32);
  comm_->all_reduce(t);
  EXPECT_TRUE(same_bits_everywhere(*host_, t));
  const std::vector<double> mine = Tensor::from_vector(v, {std::int64_t(v.size())}, DType::F32).to_vector();
  Tensor expect = Tensor::from_vector(mine, {std::int64_t(v.size())}, DType::F64);
  host_->all_reduce(expect);
  const auto got = t.to_vector(), want = expect.to_vector();
  int far = 0;
  for (std::size_t i = 0; i < got.size(); ++i) far += std::abs(got[i] - want[i]) > 1e-5 * (1.0 + std::abs(want[i]));
  EXPECT_EQ(far, 0);
}

TEST_F(Nccl, AllGatherOutOfPlaceAndInPlace) {
  const int n = size(), r = rank();
  const std::int64_t len = 1001;
  for (DType dt : kDTypes) {
    std::vector<double> v(static_cast<std::size_t>(len));
    for (std::int64_t i = 0; i < len; ++i) v[std::size_t(i)] = double(r * 16 + i % 16);
    Tensor in = on_gpu(v, dt);
    Tensor out = Tensor::zeros({len * n}, dt, Device::CUDA);
    comm_->all_gather(in, out);
    // In place: this rank's block of `out` already holds its values; the others are garbage.
    std::vector<double> staged(std::size_t(len * n), -7.0);
    for (std::int64_t i = 0; i < len; ++i) staged[std::size_t(r * len + i)] = v[std::size_t(i)];
    Tensor out2 = on_gpu(staged, dt);
    Tensor block = out2.slice0(r * len, (r + 1) * len);
    comm_->all_gather(block, out2);
    auto want = [&](std::int64_t j) { return double((j / len) * 16 + (j % len) % 16); };
    EXPECT_EQ(mismatch(out, want), "");
    EXPECT_EQ(mismatch(out2, want), "") << "in place";
  }
}

TEST_F(Nccl, ReduceScatterSumAndMax) {
  const int n = size(), r = rank();
  const std::int64_t len = 777;  // per rank
  for (DType dt : kDTypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      std::vector<double> v(static_cast<std::size_t>(len * n));
      for (std::int64_t j = 0; j < len * n; ++j) v[std::size_t(j)] = double(r + 1) + double(j % 13);
      Tensor in = on_gpu(v, dt);
      Tensor out = Tensor::zeros({len}, dt, Device::CUDA);
      comm_->reduce_scatter(in, out, op);
      EXPECT_EQ(mismatch(out,
                         [&](std::int64_t i) {
                           const double k = double((r * len + i) % 13);
                           return op == ReduceOp::Sum ? double(n * (n + 1) / 2) + double(n) * k : double(n) + k;
                         }),
                "")
          << (op == ReduceOp::Sum ? "sum" : "max");
    }
}

TEST_F(Nccl, BroadcastFromEveryRoot) {
  const int n = size(), r = rank();
  for (DType dt : kDTypes)
    for (int root = 0; root < n; ++root) {
      std::vector<double> v(513, 0.0);
      if (r == root)
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(root * 10) + double(i % 10);
      Tensor t = on_gpu(v, dt);
      comm_->broadcast(t, root);
      EXPECT_EQ(mismatch(t, [&](std::int64_t i) { return double(root * 10) + double(i % 10); }), "") << "root " << root;
    }
}

TEST_F(Nccl, SendRecvInOrderAndSendRecvRingAndPairs) {
  const int n = size(), r = rank();
  const std::int64_t len = 3000;
  auto pattern = [&](int from, int k) {
    std::vector<double> v(static_cast<std::size_t>(len));
    for (std::int64_t i = 0; i < len; ++i) v[std::size_t(i)] = double(from * 8 + k * 4 + i % 4);
    return v;
  };
  for (DType dt : kDTypes) {
    // Plain send/recv between pairs (0,1), (2,3): two messages arrive in the order sent.
    if (r % 2 == 0 && r + 1 < n) {
      comm_->send(on_gpu(pattern(r, 0), dt), r + 1);
      comm_->send(on_gpu(pattern(r, 1), dt), r + 1);
    } else if (r % 2 == 1) {
      Tensor a = Tensor::zeros({len}, dt, Device::CUDA), b = Tensor::zeros({len}, dt, Device::CUDA);
      comm_->recv(a, r - 1);
      comm_->recv(b, r - 1);
      EXPECT_EQ(a.to_vector(), pattern(r - 1, 0)) << dtype_name(dt);
      EXPECT_EQ(b.to_vector(), pattern(r - 1, 1)) << dtype_name(dt);
    }
    // Ring: send to the next, receive from the previous.
    {
      Tensor got = Tensor::zeros({len}, dt, Device::CUDA);
      comm_->send_recv(on_gpu(pattern(r, 0), dt), (r + 1) % n, got, (r + n - 1) % n);
      EXPECT_EQ(got.to_vector(), pattern((r + n - 1) % n, 0)) << dtype_name(dt);
    }
    // Pairs exchanging against each other (r ^ 1 is both peers).
    if ((r ^ 1) < n) {
      Tensor got = Tensor::zeros({len}, dt, Device::CUDA);
      comm_->send_recv(on_gpu(pattern(r, 1), dt), r ^ 1, got, r ^ 1);
      EXPECT_EQ(got.to_vector(), pattern(r ^ 1, 1)) << dtype_name(dt);
    }
    // A send_recv with an empty half pairs with a plain call.
    if (r % 2 == 0 && r + 1 < n) {
      Tensor none = Tensor::empty({0}, dt, Device::CUDA);
      comm_->send_recv(on_gpu(pattern(r, 0), dt), r + 1, none, r + 1);
    } else if (r % 2 == 1) {
      Tensor got = Tensor::zeros({len}, dt, Device::CUDA);
      comm_->recv(got, r - 1);
      EXPECT_EQ(got.to_vector(), pattern(r - 1, 0)) << dtype_name(dt);
    }
    // With itself: a copy.
    {
      Tensor got = Tensor::zeros({len}, dt, Device::CUDA);
      comm_->send_recv(on_gpu(pattern(r, 1), dt), r, got, r);
      EXPECT_EQ(got.to_vector(), pattern(r, 1)) << dtype_name(dt);
    }
  }
}

TEST_F(Nccl, LargeSendRecvAroundTheRingAndBetweenPairs) {
  // 64 MiB of fp32 each way: far beyond any buffering, so only a fused send/recv completes.
  const int n = size(), r = rank();
  const std::int64_t len = std::int64_t(16) << 20;
  auto fill = [&](int from, int salt) {
    Tensor h = Tensor::empty({len}, DType::F32);
    float* p = h.data<float>();
    for (std::int64_t i = 0; i < len; ++i)
      p[i] = float((std::uint64_t(i) * 2654435761u + std::uint64_t(from * 7 + salt)) % 65536);  // exact in fp32
    return h;
  };
  for (int salt : {0, 1}) {
    const int to = salt == 0 ? (r + 1) % n : (r ^ 1) < n ? (r ^ 1) : r;
    const int from = salt == 0 ? (r + n - 1) % n : to;
    Tensor send = fill(r, salt).to(Device::CUDA);
    Tensor got = Tensor::zeros({len}, DType::F32, Device::CUDA);
    comm_->send_recv(send, to, got, from);
    const Tensor back = got.to(Device::CPU), want = fill(from, salt);
    EXPECT_EQ(std::memcmp(back.raw(), want.raw(), want.nbytes()), 0) << (salt == 0 ? "ring" : "pairs");
  }
}

TEST_F(Nccl, Barrier) {
  for (int i = 0; i < 3; ++i) comm_->barrier();
  // The barrier waits for the work before it: a broadcast is complete on the device after it.
  Tensor t = on_gpu(std::vector<double>(100, double(rank() == 0 ? 5 : 0)), DType::F32);
  comm_->broadcast(t, 0);
  comm_->barrier();
  EXPECT_EQ(t.to_vector(), std::vector<double>(100, 5.0));
}

TEST_F(Nccl, ControlValuesThroughTheDevice) {
  const int n = size(), r = rank();
  EXPECT_EQ(all_reduce_value(*comm_, double(r + 1)), double(n * (n + 1) / 2));
  EXPECT_EQ(all_reduce_value(*comm_, double(r), ReduceOp::Max), double(n - 1));
  std::vector<double> want;
  for (int q = 0; q < n; ++q) {
    want.push_back(q);
    want.push_back(0.5 * q);
  }
  EXPECT_EQ(all_gather_values(*comm_, {double(r), 0.5 * r}), want);
  const std::string path = "runs/x/step_10 \xc3\xbc";
  EXPECT_EQ(broadcast_string(*comm_, r == n - 1 ? path : "other", n - 1), path);
  EXPECT_EQ(broadcast_string(*comm_, r == 0 ? "" : "other", 0), "");
}

TEST_F(Nccl, DeviceGroupsForEveryLayout) {
  const int world = size();
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp <= world; ++pp) {
      if (world % (tp * pp) != 0) continue;
      const ProcessGroups host = make_process_groups(Backend::Mpi, tp, pp);
      const ProcessGroups dev = make_device_groups(host);
      const ParallelLayout& l = host.layout;
      SCOPED_TRACE(l.describe() + " " + l.describe_rank());
      EXPECT_EQ(dev.layout.describe_rank(), l.describe_rank());
      EXPECT_EQ(dev.layout.describe(), l.describe());
      std::vector<int> all(static_cast<std::size_t>(world));
      for (int q = 0; q < world; ++q) all[std::size_t(q)] = q;
      const bool tied = l.pp > 1 && (l.first_stage() || l.last_stage());
      const std::vector<int> embedding =
          tied ? std::vector<int>{l.rank_of(l.tp_rank, l.dp_rank, 0), l.rank_of(l.tp_rank, l.dp_rank, l.pp - 1)}
               : std::vector<int>{l.rank};
      struct Group {
        const char* name;
        const std::shared_ptr<Communicator>& h;
        const std::shared_ptr<Communicator>& d;
        std::vector<int> ranks;
      };
      const Group groups[] = {{"world", host.world, dev.world, all},
                              {"tp", host.tp, dev.tp, l.tp_group()},
                              {"dp", host.dp, dev.dp, l.dp_group()},
                              {"pp", host.pp, dev.pp, l.pp_group()},
                              {"embedding", host.embedding, dev.embedding, embedding}};
      // Checked on every rank, then the all-reduces in the same order everywhere.
      for (const Group& g : groups) {
        SCOPED_TRACE(g.name);
        EXPECT_EQ(g.d->name(), g.name);
        EXPECT_EQ(g.d->size(), int(g.ranks.size()));
        EXPECT_EQ(g.d->size(), g.h->size());
        EXPECT_EQ(g.d->rank(), g.h->rank());
        EXPECT_EQ(g.ranks[std::size_t(g.d->rank())], l.rank);
        EXPECT_EQ(g.d->backend(), g.ranks.size() > 1 ? "nccl" : "single");
        EXPECT_TRUE(g.d->supports(DType::F32, Device::CUDA));
      }
      for (const Group& g : groups) {
        Tensor t = on_gpu({double(l.rank), 1.0}, DType::F32);
        g.d->all_reduce(t);
        double sum = 0;
        for (int q : g.ranks) sum += q;
        EXPECT_EQ(t.to_vector(), (std::vector<double>{sum, double(g.ranks.size())})) << g.name;
      }
      dev.world->barrier();
    }
}

#if !NSATRON_WITH_NCCL
// Without NCCL (CPU builds, or CUDA builds where it was not found) no GPU is needed to see the
// refusal: the world group of more than one rank needs NCCL.
TEST(NoNccl, DeviceGroupsRefuseClearly) {
  const ProcessGroups host = make_process_groups(Backend::Mpi, 1, 1);
  try {
    make_device_groups(host);
    FAIL() << "make_device_groups without NCCL";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("this build has no NCCL"), std::string::npos) << e.what();
  }
}
#endif
