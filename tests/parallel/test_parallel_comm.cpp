// Communicators, process groups and the data-parallel optimizer, under mpirun with 1, 2 and 4
// ranks (one ctest entry per count). Every test runs on every rank; a failure on any rank
// fails the run (mpi_gtest_main.cpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/comm/single_communicator.h"
#include "core/util/error.h"
#include "parallel/data_parallel.h"
#include "parallel/layout.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"

using namespace nsatron;
using namespace nsatron::parallel;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::vector<double> random_values(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(std::size_t(n), 0.0);
  for (auto& x : v) x = d(g);
  return v;
}

// True when `t` holds the same bytes on every rank of comm.
bool same_bits_everywhere(Communicator& comm, const Tensor& t) {
  Tensor all = Tensor::empty({t.numel() * comm.size()}, t.dtype());
  comm.all_gather(t, all);
  const char* p = static_cast<const char*>(all.raw());
  for (int r = 1; r < comm.size(); ++r)
    if (std::memcmp(p, p + t.nbytes() * std::size_t(r), t.nbytes()) != 0) return false;
  return true;
}

}  // namespace

TEST(Layout, FormulaGroupsAndInverse) {
  for (int world = 1; world <= 12; ++world)
    for (int tp = 1; tp <= world; ++tp)
      for (int pp = 1; pp <= world; ++pp) {
        if (world % (tp * pp) != 0) continue;
        std::vector<int> seen_tp(std::size_t(world), 0), seen_dp(std::size_t(world), 0), seen_pp(std::size_t(world), 0);
        for (int rank = 0; rank < world; ++rank) {
          const ParallelLayout l = ParallelLayout::make(world, tp, pp, rank);
          ASSERT_EQ(l.dp, world / (tp * pp));
          ASSERT_EQ(rank, l.tp_rank + tp * (l.dp_rank + l.dp * l.pp_rank)) << l.describe_rank();
          ASSERT_EQ(l.rank_of(l.tp_rank, l.dp_rank, l.pp_rank), rank);
          const auto t = l.tp_group(), d = l.dp_group(), p = l.pp_group();
          ASSERT_EQ(int(t.size()), tp);
          ASSERT_EQ(int(d.size()), l.dp);
          ASSERT_EQ(int(p.size()), pp);
          ASSERT_EQ(t[std::size_t(l.tp_rank)], rank);
          ASSERT_EQ(d[std::size_t(l.dp_rank)], rank);
          ASSERT_EQ(p[std::size_t(l.pp_rank)], rank);
          for (std::size_t i = 1; i < t.size(); ++i) ASSERT_EQ(t[i], t[i - 1] + 1);  // TP ranks are neighbours
          if (l.tp_rank == 0) for (int r : t) ++seen_tp[std::size_t(r)];
          if (l.dp_rank == 0) for (int r : d) ++seen_dp[std::size_t(r)];
          if (l.pp_rank == 0) for (int r : p) ++seen_pp[std::size_t(r)];
        }
        for (int r = 0; r < world; ++r) {  // each kind of group partitions the world
          ASSERT_EQ(seen_tp[std::size_t(r)], 1);
          ASSERT_EQ(seen_dp[std::size_t(r)], 1);
          ASSERT_EQ(seen_pp[std::size_t(r)], 1);
        }
      }
  const ParallelLayout l = ParallelLayout::make(16, 2, 2, 13);  // 13 = 1 + 2 * (2 + 4 * 1)
  EXPECT_EQ(l.tp_rank, 1);
  EXPECT_EQ(l.dp_rank, 2);
  EXPECT_EQ(l.pp_rank, 1);
  EXPECT_EQ(l.describe(), "tp=2 pp=2 dp=4");
}

TEST(Layout, RefusesImpossibleWorlds) {
  EXPECT_THROW(ParallelLayout::make(6, 4, 1, 0), UserError);
  EXPECT_THROW(ParallelLayout::make(4, 2, 1, 4), UserError);
  EXPECT_THROW(ParallelLayout::make(0, 1, 1, 0), UserError);
  try {
    ParallelLayout::make(3, 2, 1, 0);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("world size 3"), std::string::npos) << e.what();
  }
}

TEST(SingleCommunicator, IsAGroupOfOne) {
  SingleCommunicator c("dp");
  EXPECT_EQ(c.size(), 1);
  Tensor t = Tensor::from_vector({1, 2, 3}, {3}, DType::F32);
  c.all_reduce(t);
  EXPECT_EQ(t.to_vector(), (std::vector<double>{1, 2, 3}));
  Tensor out = Tensor::zeros({3}, DType::F32);
  c.all_gather(t, out);
  EXPECT_EQ(out.to_vector(), t.to_vector());
  Tensor rs = Tensor::zeros({3}, DType::F32);
  c.reduce_scatter(t, rs);
  EXPECT_EQ(rs.to_vector(), t.to_vector());
  EXPECT_THROW(c.send(t, 0), std::logic_error);
  EXPECT_EQ(broadcast_string(c, "hello", 0), "hello");
  // send_recv with itself (peers 0) is a copy; any other peer is refused.
  Tensor got = Tensor::zeros({3}, DType::F32);
  c.send_recv(t, 0, got, 0);
  EXPECT_EQ(got.to_vector(), t.to_vector());
  EXPECT_THROW(c.send_recv(t, 1, got, 0), std::logic_error);
  EXPECT_THROW(c.send_recv(t, 0, got, 1), std::logic_error);
  EXPECT_THROW(c.send_recv(t, 0, t, 0), std::logic_error);  // overlapping
  Tensor four = Tensor::zeros({4}, DType::F32);
  EXPECT_THROW(c.send_recv(t, 0, four, 0), std::logic_error);
  // No peer for the non-blocking halves either; nothing is posted ahead.
  EXPECT_FALSE(c.posts_ahead());
  EXPECT_THROW(c.start_send(t, 0), std::logic_error);
  EXPECT_THROW(c.start_recv(got, 0), std::logic_error);
}

// start_all_reduce's rule: nothing else on the communicator between a start and wait_all()
// (a blocking collective there would, on NCCL, be ordered against the started one on another
// stream); the call is refused with the group and the call named, and wait_all() clears it.
TEST(SingleCommunicator, RefusesCallsBetweenAStartAndWaitAll) {
  SingleCommunicator c("tp");
  Tensor t = Tensor::from_vector({1, 2, 3}, {3}, DType::F32);
  Tensor u = Tensor::from_vector({4, 5, 6}, {3}, DType::F32);
  c.start_all_reduce(t);
  c.start_all_reduce(u);  // several starts are one batch
  try {
    c.all_reduce(u);
    ADD_FAILURE() << "all_reduce between a start and wait_all() was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("tp.all_reduce: called while 2 started all-reduce(s)"), std::string::npos)
        << e.what();
  }
  Tensor out = Tensor::zeros({3}, DType::F32);
  EXPECT_THROW(c.all_gather(t, out), std::logic_error);
  EXPECT_THROW(c.reduce_scatter(t, out), std::logic_error);
  EXPECT_THROW(c.broadcast(t, 0), std::logic_error);
  EXPECT_THROW(c.barrier(), std::logic_error);
  EXPECT_THROW(broadcast_string(c, "x", 0), std::logic_error);
  c.wait_all();
  EXPECT_NO_THROW(c.all_reduce(u));
  EXPECT_NO_THROW(c.barrier());
  EXPECT_EQ(t.to_vector(), (std::vector<double>{1, 2, 3}));
}

class Mpi : public ::testing::Test {
 protected:
  void SetUp() override { comm_ = MpiCommunicator::world("world"); }
  std::unique_ptr<MpiCommunicator> comm_;
};

TEST_F(Mpi, RankAndSizeMatchTheWorld) {
  EXPECT_EQ(comm_->rank(), world_rank());
  EXPECT_EQ(comm_->size(), world_size());
  EXPECT_EQ(comm_->backend(), "mpi");
  EXPECT_FALSE(comm_->supports(DType::BF16, Device::CPU));
  EXPECT_FALSE(comm_->supports(DType::F32, Device::CUDA));
}

TEST_F(Mpi, AllReduceSumAndMaxFp32Fp64) {
  const int n = comm_->size(), r = comm_->rank();
  for (DType dt : {DType::F32, DType::F64}) {
    std::vector<double> v(1000);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(r + 1) + double(i);
    Tensor s = Tensor::from_vector(v, {1000}, dt), m = Tensor::from_vector(v, {1000}, dt);
    comm_->all_reduce(s, ReduceOp::Sum);
    comm_->all_reduce(m, ReduceOp::Max);
    const auto sv = s.to_vector(), mv = m.to_vector();
    for (std::size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(sv[i], double(n) * (n + 1) / 2 + double(n) * double(i));
      ASSERT_EQ(mv[i], double(n) + double(i));
    }
  }
}

TEST_F(Mpi, AllReduceGivesTheSameBitsOnEveryRank) {
  for (std::int64_t n : {1, 7, 4096, 100003}) {
    Tensor t = Tensor::from_vector(random_values(n, 1000 + std::uint64_t(comm_->rank())), {n}, DType::F32);
    comm_->all_reduce(t);
    EXPECT_TRUE(same_bits_everywhere(*comm_, t)) << n;
  }
}

TEST_F(Mpi, AllGatherOutOfPlaceAndInPlace) {
  const int n = comm_->size(), r = comm_->rank();
  Tensor in = Tensor::from_vector({double(r), double(10 * r)}, {2}, DType::F64);
  Tensor out = Tensor::zeros({2 * n}, DType::F64);
  comm_->all_gather(in, out);
  Tensor inplace = Tensor::zeros({2 * n}, DType::F64);
  inplace.slice0(2 * r, 2 * r + 2).copy_from(in);
  Tensor mine = inplace.slice0(2 * r, 2 * r + 2);
  comm_->all_gather(mine, inplace);
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(out.to_vector()[std::size_t(2 * k)], k);
    EXPECT_EQ(out.to_vector()[std::size_t(2 * k + 1)], 10 * k);
  }
  EXPECT_EQ(inplace.to_vector(), out.to_vector());
  Tensor wrong = Tensor::zeros({2 * n + 1}, DType::F64);
  EXPECT_THROW(comm_->all_gather(in, wrong), std::logic_error);
}

TEST_F(Mpi, ReduceScatterGivesEachRankItsBlockOfTheSum) {
  const int n = comm_->size(), r = comm_->rank();
  const std::int64_t block = 5;
  std::vector<double> v(std::size_t(block * n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(i) * (r + 1);
  Tensor in = Tensor::from_vector(v, {block * n}, DType::F32), out = Tensor::zeros({block}, DType::F32);
  comm_->reduce_scatter(in, out);
  const double ranks_sum = double(n) * (n + 1) / 2;
  for (std::int64_t i = 0; i < block; ++i) EXPECT_EQ(out.to_vector()[std::size_t(i)], double(r * block + i) * ranks_sum);
  EXPECT_THROW(comm_->reduce_scatter(in, in), std::logic_error);
}

TEST_F(Mpi, BroadcastFromEveryRoot) {
  for (int root = 0; root < comm_->size(); ++root) {
    Tensor t = Tensor::from_vector({double(comm_->rank()), 2.5}, {2}, DType::F32);
    comm_->broadcast(t, root);
    EXPECT_EQ(t.to_vector(), (std::vector<double>{double(root), 2.5}));
    EXPECT_EQ(broadcast_string(*comm_, comm_->rank() == root ? "path/step_" + std::to_string(root) : "x", root),
              "path/step_" + std::to_string(root));
  }
  EXPECT_EQ(broadcast_string(*comm_, comm_->rank() == 0 ? "" : "junk", 0), "");
}

TEST_F(Mpi, SendRecvAroundARing) {
  const int n = comm_->size(), r = comm_->rank();
  if (n == 1) GTEST_SKIP() << "one rank: no peer";
  Tensor out = Tensor::from_vector({double(r), double(r * r)}, {2}, DType::F64), in = Tensor::zeros({2}, DType::F64);
  // Even ranks send first, odd ranks receive first: no deadlock for any n >= 2.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    comm_->send(out, next);
    comm_->recv(in, prev);
  } else {
    comm_->recv(in, prev);
    comm_->send(out, next);
  }
  EXPECT_EQ(in.to_vector(), (std::vector<double>{double(prev), double(prev * prev)}));
  EXPECT_THROW(comm_->send(out, r), std::logic_error);
}

// start_send / start_recv: every rank posts three receives from the previous rank, then
// starts three sends to the next (4M floats each, 16 MiB: far past MPI's eager limit, so
// blocking sends in this order would deadlock around the ring), then waits for them out of
// order; the messages pair in the order they started. Then a started send pairs with a plain
// recv. With one rank there is no peer: the calls are refused.
TEST_F(Mpi, StartedSendsAndReceivesPairInTheOrderTheyStart) {
  const int n = comm_->size(), r = comm_->rank();
  EXPECT_TRUE(comm_->posts_ahead());
  const std::int64_t count = std::int64_t(4) << 20;
  Tensor probe = Tensor::zeros({count}, DType::F32);
  if (n == 1) {
    EXPECT_THROW(comm_->start_send(probe, 0), std::logic_error);
    EXPECT_THROW(comm_->start_recv(probe, 0), std::logic_error);
    return;
  }
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto value = [](int from, int k, std::int64_t i) { return float((i * 7 + from * 13 + k * 101) % 65536); };
  std::vector<Tensor> out, in;
  std::vector<Communicator::Request> sends, recvs;
  for (int k = 0; k < 3; ++k) {
    in.push_back(Tensor::zeros({count}, DType::F32));
    recvs.push_back(comm_->start_recv(in.back(), prev));
  }
  for (int k = 0; k < 3; ++k) {
    out.push_back(Tensor::empty({count}, DType::F32));
    for (std::int64_t i = 0; i < count; ++i) out.back().data<float>()[i] = value(r, k, i);
    sends.push_back(comm_->start_send(out.back(), next));
  }
  for (int k : {2, 0, 1}) comm_->wait(recvs[std::size_t(k)]);
  for (int k = 0; k < 3; ++k) {
    bool same = true;
    for (std::int64_t i = 0; i < count && same; ++i) same = in[std::size_t(k)].data<float>()[i] == value(prev, k, i);
    EXPECT_TRUE(same) << "message " << k << " from rank " << prev;
  }
  for (Communicator::Request request : sends) comm_->wait(request);
  EXPECT_THROW(comm_->wait(sends[0]), std::logic_error);  // waited for already
  // A started send against a plain recv (every rank starts before it receives: no deadlock).
  const Communicator::Request send = comm_->start_send(out[0], next);
  comm_->recv(probe, prev);
  comm_->wait(send);
  EXPECT_EQ(probe.data<float>()[count - 1], value(prev, 0, count - 1));
  // An empty tensor is no message: done at once.
  Tensor empty = Tensor::zeros({0}, DType::F32);
  EXPECT_EQ(comm_->start_recv(empty, prev), Communicator::kDone);
  EXPECT_THROW(comm_->start_send(probe, r), std::logic_error);
}

// send_recv around the ring (send to the next rank, receive from the previous) and between
// pairs (0 <-> 1, 2 <-> 3), every rank calling it at once with 4M floats (16 MiB, far past
// MPI's eager limit: a send then a recv on every rank would deadlock). With one rank the
// ring is this rank to itself (a copy).
TEST_F(Mpi, SendRecvExchangesLargeTensorsWithoutDeadlock) {
  const int n = comm_->size(), r = comm_->rank();
  const std::int64_t count = std::int64_t(4) << 20;
  auto pattern = [&](int from, std::int64_t i) { return float((i * 7 + from * 13) % 65536); };
  Tensor out = Tensor::empty({count}, DType::F32), in = Tensor::empty({count}, DType::F32);
  for (std::int64_t i = 0; i < count; ++i) out.data<float>()[i] = pattern(r, i);
  auto received_from = [&](int from) {
    for (std::int64_t i = 0; i < count; ++i)
      if (in.data<float>()[i] != pattern(from, i)) return false;
    return true;
  };
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  in.zero_();
  comm_->send_recv(out, next, in, prev);
  EXPECT_TRUE(received_from(prev)) << "ring";
  if (n % 2 == 0) {
    const int partner = r ^ 1;
    in.zero_();
    comm_->send_recv(out, partner, in, partner);
    EXPECT_TRUE(received_from(partner)) << "pairs";
  }
}

// Each half of a send_recv pairs with a plain send or recv; the two halves may differ in size,
// and an empty half sends or receives nothing.
TEST_F(Mpi, SendRecvPairsWithSendAndRecv) {
  const int n = comm_->size(), r = comm_->rank();
  if (n == 1) GTEST_SKIP() << "one rank: no peer";
  if (r >= n - n % 2) return;  // pairs only
  const int partner = r ^ 1;
  const bool even = r % 2 == 0;
  // Uneven sizes: the even rank sends 3 fp64 and receives 5; the odd rank, a plain recv then
  // a plain send.
  Tensor three = Tensor::from_vector({1, 2, 3}, {3}, DType::F64), five = Tensor::from_vector({4, 5, 6, 7, 8}, {5}, DType::F64);
  if (even) {
    Tensor got = Tensor::zeros({5}, DType::F64);
    comm_->send_recv(three, partner, got, partner);
    EXPECT_EQ(got.to_vector(), five.to_vector());
  } else {
    Tensor got = Tensor::zeros({3}, DType::F64);
    comm_->recv(got, partner);
    comm_->send(five, partner);
    EXPECT_EQ(got.to_vector(), three.to_vector());
  }
  // An empty half: the even rank only receives, the odd rank only sends (then the reverse).
  Tensor empty = Tensor::zeros({0}, DType::F32), got = Tensor::zeros({2}, DType::F32);
  Tensor mine = Tensor::from_vector({double(r), 0.5}, {2}, DType::F32);
  if (even) {
    comm_->send_recv(empty, partner, got, partner);
    comm_->send_recv(mine, partner, empty, partner);
  } else {
    comm_->send_recv(mine, partner, empty, partner);
    comm_->send_recv(empty, partner, got, partner);
  }
  EXPECT_EQ(got.to_vector(), (std::vector<double>{double(partner), 0.5}));
  // Argument errors: a peer outside the group, itself for one half only, overlapping tensors.
  EXPECT_THROW(comm_->send_recv(mine, n, got, partner), std::logic_error);
  EXPECT_THROW(comm_->send_recv(mine, r, got, partner), std::logic_error);
  EXPECT_THROW(comm_->send_recv(mine, partner, mine, partner), std::logic_error);
}

TEST_F(Mpi, ControlValues) {
  const int n = comm_->size(), r = comm_->rank();
  EXPECT_EQ(all_reduce_value(*comm_, r + 1.0, ReduceOp::Sum), n * (n + 1) / 2.0);
  EXPECT_EQ(all_reduce_value(*comm_, r == n - 1 ? 15.0 : 0.0, ReduceOp::Max), 15.0);
  const auto all = all_gather_values(*comm_, {double(r), -double(r)});
  ASSERT_EQ(all.size(), std::size_t(2 * n));
  for (int k = 0; k < n; ++k) EXPECT_EQ(all[std::size_t(2 * k + 1)], -k);
  comm_->barrier();
}

TEST(ProcessGroups, EveryLayoutOfThisWorld) {
  const int world = world_size();
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp <= world; ++pp) {
      if (world % (tp * pp) != 0) continue;
      ProcessGroups g = make_process_groups(Backend::Mpi, tp, pp);
      const ParallelLayout& l = g.layout;
      EXPECT_EQ(l.rank, world_rank());
      EXPECT_EQ(g.world->size(), world);
      EXPECT_EQ(g.tp->size(), tp);
      EXPECT_EQ(g.dp->size(), l.dp);
      EXPECT_EQ(g.pp->size(), pp);
      EXPECT_EQ(g.tp->rank(), l.tp_rank);
      EXPECT_EQ(g.dp->rank(), l.dp_rank);
      EXPECT_EQ(g.pp->rank(), l.pp_rank);
      EXPECT_EQ(g.tp->name(), "tp");
      // Each group holds exactly the ranks the layout says, in order.
      for (auto [comm, ranks] : {std::pair{g.tp.get(), l.tp_group()}, {g.dp.get(), l.dp_group()}, {g.pp.get(), l.pp_group()}}) {
        const auto got = all_gather_values(*comm, {double(l.rank)});
        ASSERT_EQ(got.size(), ranks.size());
        for (std::size_t i = 0; i < ranks.size(); ++i) EXPECT_EQ(got[i], ranks[i]) << comm->name() << " tp=" << tp << " pp=" << pp;
      }
    }
  EXPECT_THROW(make_process_groups(Backend::Single, 2, 1), UserError);
  EXPECT_EQ(make_process_groups(Backend::Single, 1, 1).dp->backend(), "single");
  EXPECT_EQ(make_process_groups(Backend::Single, 1, 1).embedding->name(), "embedding");
}

// The tied-embedding group: with pp > 1, the first- and last-stage ranks of each (tp_rank,
// dp_rank) pair up (first stage = rank 0); the middle stages and pp == 1 get a group of one.
// All-reducing the rank numbers gives the pair's sum (or this rank's own).
TEST(ProcessGroups, EmbeddingGroupPairsTheFirstAndLastStage) {
  const int world = world_size();
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp <= world; ++pp) {
      if (world % (tp * pp) != 0) continue;
      ProcessGroups g = make_process_groups(Backend::Mpi, tp, pp);
      const ParallelLayout& l = g.layout;
      const std::string where = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " " + l.describe_rank();
      ASSERT_TRUE(g.embedding) << where;
      EXPECT_EQ(g.embedding->name(), "embedding") << where;
      const double sum = all_reduce_value(*g.embedding, double(l.rank));
      if (pp > 1 && (l.first_stage() || l.last_stage())) {
        const int first = l.rank_of(l.tp_rank, l.dp_rank, 0), last = l.rank_of(l.tp_rank, l.dp_rank, pp - 1);
        EXPECT_EQ(g.embedding->size(), 2) << where;
        EXPECT_EQ(g.embedding->rank(), l.first_stage() ? 0 : 1) << where;
        EXPECT_EQ(g.embedding->backend(), "mpi") << where;
        EXPECT_EQ(sum, double(first + last)) << where;
        EXPECT_EQ(all_gather_values(*g.embedding, {double(l.rank)}), (std::vector<double>{double(first), double(last)}))
            << where;
      } else {
        EXPECT_EQ(g.embedding->size(), 1) << where;
        EXPECT_EQ(g.embedding->backend(), "single") << where;
        EXPECT_EQ(sum, double(l.rank)) << where;
      }
    }
}

TEST(DataParallel, PartitionIsWholeSegmentsAndBalanced) {
  std::vector<ParamSegment> segs;
  std::int64_t at = 0;
  for (std::int64_t n : {100, 5, 40, 40, 7, 300, 1, 60}) segs.push_back({at, n, true}), at += n;
  for (int dp = 1; dp <= 5; ++dp) {
    const auto b = partition_segments(segs, dp);
    ASSERT_EQ(b.size(), std::size_t(dp + 1));
    EXPECT_EQ(b.front(), 0);
    EXPECT_EQ(b.back(), at);
    for (int r = 0; r < dp; ++r) {
      EXPECT_LE(b[std::size_t(r)], b[std::size_t(r) + 1]);
      bool on_boundary = b[std::size_t(r)] == 0;
      for (const auto& s : segs) on_boundary |= s.offset == b[std::size_t(r)];
      EXPECT_TRUE(on_boundary) << "dp " << dp << " rank " << r;
    }
  }
  // 553 elements: the ideal split 276.5 lies nearest to the boundary at 192 (then 492).
  EXPECT_EQ(partition_segments(segs, 2)[1], 192);
}

// The replicated and the ZeRO-1 optimizer over this world's DP group give the weights of a
// single process that sums every rank's gradients, on every rank.
TEST(DataParallel, ReplicatedAndZero1MatchOneProcess) {
  ProcessGroups g = make_process_groups(Backend::Mpi, 1, 1);
  const int dp = g.dp->size(), r = g.dp->rank();
  std::vector<ParamSegment> segs;
  std::int64_t n = 0;
  for (std::int64_t k : {64, 3, 130, 17, 1000, 9}) segs.push_back({n, k, k != 3}), n += k;
  const auto w0 = random_values(n, 7);
  AdamWHyper hp{1e-2, 0.9, 0.95, 1e-8, 0.1};
  // Reference: one process with the sum of every rank's gradients.
  Tensor ref_w = Tensor::from_vector(w0, {n}, DType::F32), ref_m = Tensor::zeros({n}, DType::F32),
         ref_v = Tensor::zeros({n}, DType::F32);
  std::vector<Tensor> ws, gs;
  std::vector<std::unique_ptr<DataParallelOptimizer>> opts;
  for (bool zero1 : {false, true}) {
    ws.push_back(Tensor::from_vector(w0, {n}, DType::F32));
    gs.push_back(Tensor::zeros({n}, DType::F32));
    // A tiny bucket (48 bytes) exercises many all-reduce calls.
    opts.push_back(std::make_unique<DataParallelOptimizer>(g.dp, ws.back(), gs.back(), segs, zero1, 48));
  }
  EXPECT_EQ(opts[0]->buckets(), dp == 1 ? 0 : (n + 11) / 12);
  for (int step = 1; step <= 3; ++step) {
    std::vector<double> sum(std::size_t(n), 0.0);
    for (int k = 0; k < dp; ++k) {
      const auto gk = random_values(n, 100 * std::uint64_t(step) + std::uint64_t(k));
      for (std::int64_t i = 0; i < n; ++i) sum[std::size_t(i)] += double(float(gk[std::size_t(i)]));
      if (k == r)
        for (auto& gt : gs) gt.copy_from(Tensor::from_vector(gk, {n}, DType::F32));
    }
    Tensor ref_g = Tensor::from_vector(sum, {n}, DType::F32);
    adamw_step(ref_w, ref_g, ref_m, ref_v, segs, hp, step, 0.5);
    double ref_norm = 0;
    for (double x : ref_g.to_vector()) ref_norm += x * x;
    ref_norm = std::sqrt(ref_norm);
    for (auto& o : opts) {
      o->reduce_gradients();
      EXPECT_NEAR(o->grad_norm(), ref_norm, 1e-5 * ref_norm);
      o->step(hp, step, 0.5);
    }
  }
  const auto ref = ref_w.to_vector();
  for (std::size_t k = 0; k < opts.size(); ++k) {
    const auto got = ws[k].to_vector();
    double worst = 0;
    for (std::int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(got[std::size_t(i)] - ref[std::size_t(i)]));
    EXPECT_LT(worst, 1e-5) << (k ? "zero1" : "replicated");
    EXPECT_TRUE(same_bits_everywhere(*g.world, ws[k])) << (k ? "zero1" : "replicated");
  }
  // ZeRO-1 holds moments for its whole tensors only; together they cover the buffer once.
  const std::int64_t owned = opts[1]->owned_end() - opts[1]->owned_begin();
  EXPECT_EQ(opts[1]->m().numel(), owned);
  EXPECT_EQ(all_reduce_value(*g.world, double(owned)), double(n));
}

// Overlap (parallel.overlap_grad_reduce): with tiny buckets (12 elements), the ranges reported
// in backward order (last segment first) start each bucket as soon as it is complete, the rest
// start in reduce_gradients; the reduced gradients are the bits of the plain reduction. A
// range reported twice, or a report before arm_overlap, is refused.
TEST(DataParallel, OverlappedBucketsGiveTheBitsOfThePlainReduction) {
  ProcessGroups g = make_process_groups(Backend::Mpi, 1, 1);
  const int dp = g.dp->size();
  std::vector<ParamSegment> segs;
  std::int64_t n = 0;
  for (std::int64_t k : {64, 3, 130, 17, 1000, 9}) segs.push_back({n, k, true}), n += k;
  const auto w0 = random_values(n, 5);
  Tensor plain_w = Tensor::from_vector(w0, {n}, DType::F32), plain_g = Tensor::zeros({n}, DType::F32);
  Tensor over_w = Tensor::from_vector(w0, {n}, DType::F32), over_g = Tensor::zeros({n}, DType::F32);
  DataParallelOptimizer plain(g.dp, plain_w, plain_g, segs, false, 48);
  DataParallelOptimizer over(g.dp, over_w, over_g, segs, false, 48);
  for (int step = 1; step <= 2; ++step) {
    const Tensor mine = Tensor::from_vector(random_values(n, 50 * std::uint64_t(step) + std::uint64_t(g.dp->rank())),
                                            {n}, DType::F32);
    plain_g.copy_from(mine);
    over_g.copy_from(mine);
    plain.reduce_gradients();
    EXPECT_EQ(plain.last_overlapped_buckets(), 0);
    over.arm_overlap();
    // Every segment but the first, last first: the buckets from the one holding element 64 on.
    for (std::size_t i = segs.size(); i-- > 1;) over.grads_ready(segs[i].offset, segs[i].offset + segs[i].numel);
    over.reduce_gradients();
    EXPECT_EQ(over.last_overlapped_buckets(), dp == 1 ? 0 : over.buckets() - (64 + 11) / 12);
    EXPECT_EQ(std::memcmp(plain_g.raw(), over_g.raw(), plain_g.nbytes()), 0) << "step " << step;
    EXPECT_TRUE(same_bits_everywhere(*g.world, over_g));
  }
  if (dp == 1) return;
  EXPECT_THROW(over.grads_ready(0, 1), std::logic_error);  // not armed
  over.arm_overlap();
  over.grads_ready(0, n);
  EXPECT_THROW(over.grads_ready(5, 6), std::logic_error);  // twice
  over.reduce_gradients();
  EXPECT_EQ(over.last_overlapped_buckets(), over.buckets());
}
