// The 1F1B pipeline schedule (parallel/pipeline.h), under mpirun with 1, 2 and 4 ranks.
//
// Schedule: every stage's steps for P <= 8 stages and A <= 16 micro-batches are replayed
// together with blocking transfers (a send completes only when the peer has posted the
// matching receive, as MPI does past its eager limit): no deadlock, every message carries the
// micro-batch its receiver expects, the forward/backward order is 1F1B.
//
// Runs: a toy model of P stages, stage s computing y = tanh(w_s x + b_s) elementwise, the
// loss sum(c_mb * y) on the last stage; run_1f1b over the PP groups of every (tp, pp) layout
// of this world with A in {1, 2, 3, 5, 8}, with small and large (512 KiB) messages. Each rank
// computes the whole chain in one process as the reference: the gradients of w_s and b_s and
// the losses are equal bit for bit; the calls on each stage come in the 1F1B order with at most
// min(P - s, A) micro-batches in flight.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/comm/single_communicator.h"
#include "parallel/pipeline.h"
#include "parallel/process_groups.h"

using namespace nsatron;
using namespace nsatron::parallel;

namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// ---- the schedule, replayed with blocking transfers ---------------------------------------------

struct Part {
  bool send;
  int peer;
  bool activation;  // the s -> s+1 channel (activations) or s+1 -> s (gradients)
  std::int64_t mb;
};

std::vector<Part> parts_of(int s, const PipelineStep& st) {
  switch (st.op) {
    case PipelineOp::RecvForward: return {{false, s - 1, true, st.fwd_mb}};
    case PipelineOp::SendForward: return {{true, s + 1, true, st.fwd_mb}};
    case PipelineOp::SendForwardRecvBackward: return {{true, s + 1, true, st.fwd_mb}, {false, s + 1, false, st.bwd_mb}};
    case PipelineOp::RecvBackward: return {{false, s + 1, false, st.bwd_mb}};
    case PipelineOp::SendBackward: return {{true, s - 1, false, st.bwd_mb}};
    case PipelineOp::SendBackwardRecvForward: return {{true, s - 1, false, st.bwd_mb}, {false, s - 1, true, st.fwd_mb}};
    case PipelineOp::Forward:
    case PipelineOp::Backward: return {};
  }
  return {};
}

// The schedule with each send_recv done as a send then a recv (the naive pairing, which
// deadlocks): to check that replay() finds deadlocks.
std::vector<PipelineStep> naive_schedule(int s, int P, std::int64_t A) {
  std::vector<PipelineStep> out;
  for (const PipelineStep& st : schedule_1f1b(s, P, A)) {
    if (st.op == PipelineOp::SendForwardRecvBackward) {
      out.push_back({PipelineOp::SendForward, st.fwd_mb, -1});
      out.push_back({PipelineOp::RecvBackward, -1, st.bwd_mb});
    } else if (st.op == PipelineOp::SendBackwardRecvForward) {
      out.push_back({PipelineOp::SendBackward, -1, st.bwd_mb});
      out.push_back({PipelineOp::RecvForward, st.fwd_mb, -1});
    } else {
      out.push_back(st);
    }
  }
  return out;
}

// Runs every stage's steps; a transfer step waits until each of its halves has met the
// matching half of the peer's current step. Returns "" or what went wrong.
std::string replay(int P, std::int64_t A, bool naive = false) {
  std::vector<std::vector<PipelineStep>> steps;
  for (int s = 0; s < P; ++s) steps.push_back(naive ? naive_schedule(s, P, A) : schedule_1f1b(s, P, A));
  std::vector<std::size_t> pc(std::size_t(P), 0);
  std::vector<std::vector<bool>> done(static_cast<std::size_t>(P));
  auto current = [&](int s) -> const PipelineStep* {
    return pc[std::size_t(s)] < steps[std::size_t(s)].size() ? &steps[std::size_t(s)][pc[std::size_t(s)]] : nullptr;
  };
  for (;;) {
    bool progress = false, finished = true;
    for (int s = 0; s < P; ++s) {
      const PipelineStep* st = current(s);
      if (!st) continue;
      finished = false;
      const auto parts = parts_of(s, *st);
      auto& d = done[std::size_t(s)];
      d.resize(parts.size(), false);
      for (std::size_t j = 0; j < parts.size(); ++j) {
        if (d[j] || !parts[j].send) continue;
        const int q = parts[j].peer;
        if (q < 0 || q >= P) return "stage " + std::to_string(s) + " sends to stage " + std::to_string(q);
        const PipelineStep* other = current(q);
        if (!other) continue;
        const auto theirs = parts_of(q, *other);
        auto& dq = done[std::size_t(q)];
        dq.resize(theirs.size(), false);
        for (std::size_t k = 0; k < theirs.size(); ++k)
          if (!dq[k] && !theirs[k].send && theirs[k].peer == s && theirs[k].activation == parts[j].activation) {
            if (theirs[k].mb != parts[j].mb)
              return "stage " + std::to_string(s) + " sends micro-batch " + std::to_string(parts[j].mb) + ", stage " +
                     std::to_string(q) + " expects " + std::to_string(theirs[k].mb);
            d[j] = dq[k] = true;
            progress = true;
          }
      }
    }
    if (finished) return "";
    for (int s = 0; s < P; ++s) {
      const PipelineStep* st = current(s);
      if (!st) continue;
      const auto& d = done[std::size_t(s)];
      if (std::count(d.begin(), d.end(), true) == std::ptrdiff_t(parts_of(s, *st).size())) {
        ++pc[std::size_t(s)];  // computations always complete; transfers once every half has
        done[std::size_t(s)].clear();
        progress = true;
      }
    }
    if (!progress) {
      std::string at;
      for (int s = 0; s < P; ++s) at += " stage " + std::to_string(s) + " at step " + std::to_string(pc[std::size_t(s)]);
      return "deadlock:" + at;
    }
  }
}

// The forward (+1) / backward (-1) calls of 1F1B on stage s: W forwards, A - W pairs, W backwards.
std::vector<std::pair<int, std::int64_t>> expected_calls(int s, int P, std::int64_t A) {
  const std::int64_t W = std::min<std::int64_t>(P - s - 1, A);
  std::vector<std::pair<int, std::int64_t>> calls;
  for (std::int64_t f = 0; f < W; ++f) calls.push_back({+1, f});
  for (std::int64_t i = 0; i < A - W; ++i) calls.push_back({+1, W + i}), calls.push_back({-1, i});
  for (std::int64_t b = A - W; b < A; ++b) calls.push_back({-1, b});
  return calls;
}

// ---- the toy model ----------------------------------------------------------------------------

struct Toy {
  int P;
  std::int64_t n;  // elements per activation
  int seed;        // differs between the DP replicas' pipelines
  double w(int s) const { return 0.7 + 0.15 * s; }
  double b(int s) const { return 0.05 * s - 0.1; }
  std::vector<double> input(std::int64_t mb) const {
    std::vector<double> x(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) x[std::size_t(i)] = std::sin(0.37 * double(i) + 1.3 * double(mb) + seed);
    return x;
  }
  std::vector<double> loss_weights(std::int64_t mb) const {  // c: loss = sum(c * y_last)
    std::vector<double> c(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) c[std::size_t(i)] = std::cos(0.11 * double(i) - 0.7 * double(mb) + seed);
    return c;
  }
  std::vector<double> forward(int s, const std::vector<double>& x) const {
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = std::tanh(w(s) * x[i] + b(s));
    return y;
  }
  // dx for dy; adds this micro-batch's dw, db.
  std::vector<double> backward(int s, const std::vector<double>& x, const std::vector<double>& y,
                               const std::vector<double>& dy, double& dw, double& db) const {
    std::vector<double> dx(x.size());
    double sw = 0, sb = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double dz = dy[i] * (1 - y[i] * y[i]);
      sw += dz * x[i];
      sb += dz;
      dx[i] = w(s) * dz;
    }
    dw += sw;
    db += sb;
    return dx;
  }
  static double loss(const std::vector<double>& c, const std::vector<double>& y) {
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += c[i] * y[i];
    return l;
  }
};

struct Result {
  std::vector<double> dw, db, losses;  // dw, db per stage (reference) or of this stage (run)
};

// All stages in one process, micro-batch after micro-batch.
Result reference(const Toy& toy, std::int64_t A) {
  Result r{std::vector<double>(std::size_t(toy.P), 0.0), std::vector<double>(std::size_t(toy.P), 0.0), {}};
  for (std::int64_t mb = 0; mb < A; ++mb) {
    std::vector<std::vector<double>> xs{toy.input(mb)}, ys;
    for (int s = 0; s < toy.P; ++s) {
      ys.push_back(toy.forward(s, xs.back()));
      xs.push_back(ys.back());
    }
    const auto c = toy.loss_weights(mb);
    r.losses.push_back(Toy::loss(c, ys.back()));
    std::vector<double> dy = c;
    for (int s = toy.P - 1; s >= 0; --s)
      dy = toy.backward(s, xs[std::size_t(s)], ys[std::size_t(s)], dy, r.dw[std::size_t(s)], r.db[std::size_t(s)]);
  }
  return r;
}

// This rank's stage under run_1f1b, recording its calls.
struct StageRun {
  Result result{{0.0}, {0.0}, {}};
  std::vector<std::pair<int, std::int64_t>> calls;
  std::int64_t max_in_flight = 0;
};

StageRun run_stage(Communicator& pp, const Toy& toy, std::int64_t A) {
  const int s = pp.rank(), P = pp.size();
  const bool first = s == 0, last = s == P - 1;
  StageRun run;
  std::map<std::int64_t, std::pair<std::vector<double>, std::vector<double>>> saved;  // mb -> (x, y)
  PipelineStage stage;
  stage.activation_shape = {toy.n};
  stage.dtype = DType::F64;
  stage.forward = [&](std::int64_t mb, const Tensor* input) -> Tensor {
    EXPECT_EQ(input == nullptr, first) << "stage " << s << " mb " << mb;
    run.calls.push_back({+1, mb});
    auto x = first ? toy.input(mb) : input->to_vector();
    auto y = toy.forward(s, x);
    saved[mb] = {x, y};
    run.max_in_flight = std::max(run.max_in_flight, std::int64_t(saved.size()));
    if (last) {
      run.result.losses.push_back(Toy::loss(toy.loss_weights(mb), y));
      return Tensor();
    }
    return Tensor::from_vector(y, {toy.n}, DType::F64);
  };
  stage.backward = [&](std::int64_t mb, const Tensor* d_output) -> Tensor {
    EXPECT_EQ(d_output == nullptr, last) << "stage " << s << " mb " << mb;
    run.calls.push_back({-1, mb});
    const auto dy = last ? toy.loss_weights(mb) : d_output->to_vector();
    auto it = saved.find(mb);
    EXPECT_NE(it, saved.end()) << "backward of mb " << mb << " before its forward";
    if (it == saved.end()) return first ? Tensor() : Tensor::zeros({toy.n}, DType::F64);
    auto dx = toy.backward(s, it->second.first, it->second.second, dy, run.result.dw[0], run.result.db[0]);
    saved.erase(it);
    return first ? Tensor() : Tensor::from_vector(dx, {toy.n}, DType::F64);
  };
  run_1f1b(pp, A, stage);
  EXPECT_TRUE(saved.empty());
  return run;
}

// Every (tp, pp) layout of this world with tp in {1, 2}.
std::vector<std::pair<int, int>> layouts() {
  std::vector<std::pair<int, int>> out;
  const int world = world_size();
  for (int tp : {1, 2})
    for (int pp = 1; pp <= world; ++pp)
      if (world % (tp * pp) == 0) out.push_back({tp, pp});
  return out;
}

}  // namespace

TEST(Schedule, NoDeadlockWithBlockingTransfersAndOneFOneBOrder) {
  for (int P = 1; P <= 8; ++P)
    for (std::int64_t A = 0; A <= 16; ++A) {
      EXPECT_EQ(replay(P, A), "") << "P=" << P << " A=" << A;
      for (int s = 0; s < P; ++s) {
        std::vector<std::pair<int, std::int64_t>> calls;
        std::int64_t in_flight = 0, most = 0;
        for (const PipelineStep& st : schedule_1f1b(s, P, A)) {
          if (st.op == PipelineOp::Forward) calls.push_back({+1, st.fwd_mb}), most = std::max(most, ++in_flight);
          if (st.op == PipelineOp::Backward) calls.push_back({-1, st.bwd_mb}), --in_flight;
          if (P == 1) {
            EXPECT_TRUE(st.op == PipelineOp::Forward || st.op == PipelineOp::Backward);
          }
        }
        EXPECT_EQ(calls, expected_calls(s, P, A)) << "P=" << P << " A=" << A << " stage " << s;
        EXPECT_EQ(most, std::min<std::int64_t>(P - s, A)) << "P=" << P << " A=" << A << " stage " << s;
      }
    }
  // P == 1: forward, backward, micro-batch after micro-batch.
  const auto one = schedule_1f1b(0, 1, 3);
  ASSERT_EQ(one.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(one[i].op, i % 2 ? PipelineOp::Backward : PipelineOp::Forward);
    EXPECT_EQ(i % 2 ? one[i].bwd_mb : one[i].fwd_mb, std::int64_t(i / 2));
  }
  EXPECT_THROW(schedule_1f1b(2, 2, 1), std::logic_error);
  // The replay does catch a deadlock: with a send then a recv in place of each send_recv, two
  // neighbours in their steady phase both send first.
  EXPECT_EQ(replay(2, 1, true), "");  // no steady exchange with A = 1
  EXPECT_NE(replay(2, 2, true).find("deadlock"), std::string::npos);
  EXPECT_NE(replay(4, 8, true).find("deadlock"), std::string::npos);
}

TEST(Pipeline, OneFOneBMatchesOneProcessExactly) {
  for (auto [tp, pp] : layouts()) {
    ProcessGroups g = make_process_groups(Backend::Mpi, tp, pp);
    const int s = g.pp->rank(), P = g.pp->size();
    ASSERT_EQ(P, pp);
    for (std::int64_t n : {std::int64_t(6), std::int64_t(1) << 16})  // 48 B and 512 KiB messages
      for (std::int64_t A : {1, 2, 3, 5, 8}) {
        const std::string where = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " stage " +
                                  std::to_string(s) + " n=" + std::to_string(n) + " A=" + std::to_string(A);
        const Toy toy{P, n, g.layout.dp_rank};
        const Result ref = reference(toy, A);
        const StageRun run = run_stage(*g.pp, toy, A);
        EXPECT_EQ(run.result.dw[0], ref.dw[std::size_t(s)]) << where;
        EXPECT_EQ(run.result.db[0], ref.db[std::size_t(s)]) << where;
        if (s == P - 1) {
          EXPECT_EQ(run.result.losses, ref.losses) << where;
        } else {
          EXPECT_TRUE(run.result.losses.empty()) << where;
        }
        EXPECT_EQ(run.calls, expected_calls(s, P, A)) << where;
        EXPECT_LE(run.max_in_flight, P - s) << where;
        EXPECT_EQ(run.max_in_flight, std::min<std::int64_t>(P - s, A)) << where;
      }
  }
}

TEST(Pipeline, OneStageIsForwardThenBackward) {
  SingleCommunicator pp("pp");
  const Toy toy{1, 5, 3};
  const StageRun run = run_stage(pp, toy, 4);
  const Result ref = reference(toy, 4);
  EXPECT_EQ(run.result.dw[0], ref.dw[0]);
  EXPECT_EQ(run.result.losses, ref.losses);
  EXPECT_EQ(run.calls, (std::vector<std::pair<int, std::int64_t>>{{1, 0}, {-1, 0}, {1, 1}, {-1, 1}, {1, 2}, {-1, 2}, {1, 3}, {-1, 3}}));
  EXPECT_EQ(run.max_in_flight, 1);
}

TEST(Pipeline, ForwardOnlyMatchesOneProcessExactly) {
  for (auto [tp, pp] : layouts()) {
    ProcessGroups g = make_process_groups(Backend::Mpi, tp, pp);
    const int s = g.pp->rank(), P = g.pp->size();
    for (std::int64_t n : {std::int64_t(6), std::int64_t(1) << 16})
      for (std::int64_t A : {1, 3, 8}) {
        const Toy toy{P, n, g.layout.dp_rank};
        const Result ref = reference(toy, A);
        std::vector<double> losses;
        std::vector<std::int64_t> order;
        run_pipeline_forward(
            *g.pp, A,
            [&](std::int64_t mb, const Tensor* input) -> Tensor {
              EXPECT_EQ(input == nullptr, s == 0);
              order.push_back(mb);
              const auto y = toy.forward(s, s == 0 ? toy.input(mb) : input->to_vector());
              if (s == P - 1) {
                losses.push_back(Toy::loss(toy.loss_weights(mb), y));
                return Tensor();
              }
              return Tensor::from_vector(y, {n}, DType::F64);
            },
            {n}, DType::F64);
        std::vector<std::int64_t> in_order(static_cast<std::size_t>(A));
        for (std::int64_t i = 0; i < A; ++i) in_order[std::size_t(i)] = i;
        EXPECT_EQ(order, in_order);
        if (s == P - 1) {
          EXPECT_EQ(losses, ref.losses) << "tp=" << tp << " pp=" << pp << " A=" << A;
        }
      }
  }
}
