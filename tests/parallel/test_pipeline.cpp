// The pipeline schedules (core/comm/pipeline_schedule.h, parallel/pipeline.h): 1F1B and the
// interleaved 1F1B of V model chunks per rank, under mpirun with 1, 2 and 4 ranks.
//
// Schedule: every rank's steps for P <= 8 ranks and A <= 16 micro-batches (1F1B), and for
// P <= 8, 2 <= V <= 4 and A a multiple of P up to 16 (interleaved; forward-only as well) are
// replayed together with blocking transfers (a send completes only when the peer has posted
// the matching receive, as MPI does past its eager limit; a send_recv posts both halves at
// once). Messages carry no tags, so a receive matches the peer's next send to this rank
// whatever it is: the replay checks that it is the message the receiver expects (activation or
// gradient, chunk, micro-batch). No deadlock; the forward/backward order is 1F1B, or
// Megatron's interleaved order with each chunk's micro-batches in increasing order.
//
// Runs: a toy model of P V chunks, chunk c computing y = tanh(w_c x + b_c) elementwise, the
// loss sum(c_mb * y) on the last chunk; run_1f1b over the PP groups of every (tp, pp) layout
// of this world, V = 1 with A in {1, 2, 3, 5, 8} and V in {2, 3} with A in multiples of P up to
// 8, with small and large (512 KiB) messages. Each rank computes the whole chain in one process
// as the reference: the gradients of every chunk's w_c and b_c and the losses are equal bit for
// bit; the calls on each rank come in the schedule's order, with the in-flight bound of the
// schedule.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
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

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// ---- the schedule, replayed with blocking transfers ---------------------------------------------

// One half of a transfer. A message is named by its kind, the global chunk that sent it and
// the micro-batch; a receive names the message it expects.
struct Part {
  bool send;
  int peer;
  bool activation;    // an activation (chunk c -> c + 1) or a gradient (c -> c - 1)
  std::int64_t from;  // the global chunk that sends it
  std::int64_t mb;
};

std::vector<Part> parts_of(int s, int P, int V, const PipelineStep& st) {
  (void)V;
  const int next = next_stage(s, P), prev = prev_stage(s, P);
  auto g = [&](int chunk) { return std::int64_t(chunk) * P + s; };  // global chunk of a local one
  switch (st.op) {
    case PipelineOp::RecvForward: return {{false, prev, true, g(st.fwd_chunk) - 1, st.fwd_mb}};
    case PipelineOp::SendForward: return {{true, next, true, g(st.fwd_chunk), st.fwd_mb}};
    case PipelineOp::SendForwardRecvBackward:
      return {{true, next, true, g(st.fwd_chunk), st.fwd_mb}, {false, next, false, g(st.bwd_chunk) + 1, st.bwd_mb}};
    case PipelineOp::RecvBackward: return {{false, next, false, g(st.bwd_chunk) + 1, st.bwd_mb}};
    case PipelineOp::SendBackward: return {{true, prev, false, g(st.bwd_chunk), st.bwd_mb}};
    case PipelineOp::SendBackwardRecvForward:
      return {{true, prev, false, g(st.bwd_chunk), st.bwd_mb}, {false, prev, true, g(st.fwd_chunk) - 1, st.fwd_mb}};
    case PipelineOp::SendForwardRecvForward:
      return {{true, next, true, g(st.fwd_chunk), st.fwd_mb}, {false, prev, true, g(st.recv_chunk) - 1, st.recv_mb}};
    case PipelineOp::SendBackwardRecvBackward:
      return {{true, prev, false, g(st.bwd_chunk), st.bwd_mb}, {false, next, false, g(st.recv_chunk) + 1, st.recv_mb}};
    case PipelineOp::Forward:
    case PipelineOp::Backward: return {};
  }
  return {};
}

std::string describe(const Part& p) {
  return std::string(p.activation ? "the activation" : "the gradient") + " of chunk " + std::to_string(p.from) +
         " mb " + std::to_string(p.mb);
}

// The schedule with each send_recv done as a send then a recv (the naive pairing, which
// deadlocks): to check that replay() finds deadlocks.
std::vector<PipelineStep> naive_schedule(int s, int P, std::int64_t A, int V) {
  std::vector<PipelineStep> out;
  for (const PipelineStep& st : schedule_pipeline(s, P, A, V)) {
    if (st.op == PipelineOp::SendForwardRecvBackward) {
      out.push_back({PipelineOp::SendForward, st.fwd_mb, -1});
      out.push_back({PipelineOp::RecvBackward, -1, st.bwd_mb});
    } else if (st.op == PipelineOp::SendBackwardRecvForward) {
      out.push_back({PipelineOp::SendBackward, -1, st.bwd_mb});
      out.push_back({PipelineOp::RecvForward, st.fwd_mb, -1});
    } else if (st.op == PipelineOp::SendForwardRecvForward) {
      out.push_back({PipelineOp::SendForward, st.fwd_mb, -1, st.fwd_chunk});
      out.push_back({PipelineOp::RecvForward, st.recv_mb, -1, st.recv_chunk});
    } else if (st.op == PipelineOp::SendBackwardRecvBackward) {
      out.push_back({PipelineOp::SendBackward, -1, st.bwd_mb, 0, st.bwd_chunk});
      out.push_back({PipelineOp::RecvBackward, -1, st.recv_mb, 0, st.recv_chunk});
    } else {
      out.push_back(st);
    }
  }
  return out;
}

enum class Kind { Train, Naive, ForwardOnly };

// Runs every rank's steps; a transfer step waits until each of its halves has met the
// matching half of the peer's current step (a receive matches the peer's send to this rank,
// whatever it carries: no tags). Returns "" or what went wrong.
std::string replay(int P, std::int64_t A, int V = 1, Kind kind = Kind::Train) {
  const std::int64_t C = std::int64_t(P) * V;
  std::vector<std::vector<PipelineStep>> steps;
  for (int s = 0; s < P; ++s)
    steps.push_back(kind == Kind::Naive         ? naive_schedule(s, P, A, V)
                    : kind == Kind::ForwardOnly ? schedule_forward(s, P, A, V)
                                                : schedule_pipeline(s, P, A, V));
  std::vector<std::size_t> pc(std::size_t(P), 0);
  std::vector<std::vector<bool>> done(static_cast<std::size_t>(P));
  auto current = [&](int s) -> const PipelineStep* {
    return pc[std::size_t(s)] < steps[std::size_t(s)].size() ? &steps[std::size_t(s)][pc[std::size_t(s)]] : nullptr;
  };
  // Messages to or from a chunk that does not exist.
  for (int s = 0; s < P; ++s)
    for (const PipelineStep& st : steps[std::size_t(s)])
      for (const Part& p : parts_of(s, P, V, st))
        if (p.from < 0 || p.from >= C || (p.send && p.activation && p.from == C - 1) ||
            (p.send && !p.activation && p.from == 0))
          return "stage " + std::to_string(s) + (p.send ? " sends " : " receives ") + describe(p);
  for (;;) {
    bool progress = false, finished = true;
    for (int s = 0; s < P; ++s) {
      const PipelineStep* st = current(s);
      if (!st) continue;
      finished = false;
      const auto parts = parts_of(s, P, V, *st);
      auto& d = done[std::size_t(s)];
      d.resize(parts.size(), false);
      for (std::size_t j = 0; j < parts.size(); ++j) {
        if (d[j] || !parts[j].send) continue;
        const int q = parts[j].peer;
        const PipelineStep* other = current(q);
        if (!other) continue;
        const auto theirs = parts_of(q, P, V, *other);
        auto& dq = done[std::size_t(q)];
        dq.resize(theirs.size(), false);
        for (std::size_t k = 0; k < theirs.size(); ++k)
          if (!dq[k] && !theirs[k].send && theirs[k].peer == s) {
            if (theirs[k].activation != parts[j].activation || theirs[k].from != parts[j].from ||
                theirs[k].mb != parts[j].mb)
              return "stage " + std::to_string(s) + " sends " + describe(parts[j]) + ", stage " + std::to_string(q) +
                     " expects " + describe(theirs[k]);
            d[j] = dq[k] = true;
            progress = true;
            break;
          }
      }
    }
    if (finished) return "";
    for (int s = 0; s < P; ++s) {
      const PipelineStep* st = current(s);
      if (!st) continue;
      const auto& d = done[std::size_t(s)];
      if (std::count(d.begin(), d.end(), true) == std::ptrdiff_t(parts_of(s, P, V, *st).size())) {
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

// A forward (+1) or backward (-1) call on a chunk and micro-batch.
struct Call {
  int dir;
  int chunk;
  std::int64_t mb;
  bool operator==(const Call&) const = default;
};
void PrintTo(const Call& c, std::ostream* os) { *os << (c.dir > 0 ? "F" : "B") << c.chunk << "." << c.mb; }

// The calls of 1F1B on stage s: W forwards, A - W pairs, W backwards.
std::vector<Call> expected_calls(int s, int P, std::int64_t A) {
  const std::int64_t W = std::min<std::int64_t>(P - s - 1, A);
  std::vector<Call> calls;
  for (std::int64_t f = 0; f < W; ++f) calls.push_back({+1, 0, f});
  for (std::int64_t i = 0; i < A - W; ++i) calls.push_back({+1, 0, W + i}), calls.push_back({-1, 0, i});
  for (std::int64_t b = A - W; b < A; ++b) calls.push_back({-1, 0, b});
  return calls;
}

// The calls of rank s: 1F1B with V = 1, Megatron's interleaved order with V > 1.
std::vector<Call> expected_calls(int s, int P, std::int64_t A, int V) {
  if (V == 1) return expected_calls(s, P, A);
  std::vector<Call> calls;
  for (const ChunkWork& w : interleaved_order(s, P, A, V)) calls.push_back({w.backward ? -1 : +1, w.chunk, w.mb});
  return calls;
}

// The most chunk-micro-batches in flight (forwarded, not yet backwarded) on rank s.
std::int64_t expected_in_flight(int s, int P, std::int64_t A, int V) {
  if (V == 1) return std::min<std::int64_t>(P - s, A);
  return std::min<std::int64_t>(interleaved_warmup(s, P, A, V) + 1, A * V);
}

std::vector<Call> calls_of(const std::vector<PipelineStep>& steps, std::int64_t* most) {
  std::vector<Call> calls;
  std::int64_t in_flight = 0;
  *most = 0;
  for (const PipelineStep& st : steps) {
    if (st.op == PipelineOp::Forward) calls.push_back({+1, st.fwd_chunk, st.fwd_mb}), *most = std::max(*most, ++in_flight);
    if (st.op == PipelineOp::Backward) calls.push_back({-1, st.bwd_chunk, st.bwd_mb}), --in_flight;
  }
  return calls;
}

// Each chunk's forwards, and its backwards, on micro-batches 0, 1, ..., A - 1 in order.
bool each_chunk_in_order(const std::vector<Call>& calls, int V, std::int64_t A) {
  for (int dir : {+1, -1})
    for (int v = 0; v < V; ++v) {
      std::int64_t next = 0;
      for (const Call& c : calls)
        if (c.dir == dir && c.chunk == v && c.mb != next++) return false;
      if (next != A) return false;
    }
  return true;
}

// The slots of the interleaved schedule as the table of core/comm/pipeline_schedule.h.
std::string slot_table(int P, std::int64_t A, int V) {
  std::string out;
  const auto table = interleaved_slots(P, A, V);
  for (int s = 0; s < P; ++s) {
    out += "  rank " + std::to_string(s) + ":";
    for (const auto& w : table[std::size_t(s)])
      out += w ? std::string(" ") + (w->backward ? "B" : "F") + std::to_string(w->chunk) + "." + std::to_string(w->mb)
               : std::string(" ..  ");
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  return out;
}

// ---- the toy model ----------------------------------------------------------------------------

struct Toy {
  int P;           // ranks
  std::int64_t n;  // elements per activation
  int seed;        // differs between the DP replicas' pipelines
  int V = 1;       // chunks per rank: P V chunks in all
  int chunks() const { return P * V; }
  double w(int c) const { return 0.7 + 0.15 * c / V; }
  double b(int c) const { return 0.05 * c - 0.1; }
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
  std::vector<double> forward(int c, const std::vector<double>& x) const {
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = std::tanh(w(c) * x[i] + b(c));
    return y;
  }
  // dx for dy; adds this micro-batch's dw, db.
  std::vector<double> backward(int c, const std::vector<double>& x, const std::vector<double>& y,
                               const std::vector<double>& dy, double& dw, double& db) const {
    std::vector<double> dx(x.size());
    double sw = 0, sb = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double dz = dy[i] * (1 - y[i] * y[i]);
      sw += dz * x[i];
      sb += dz;
      dx[i] = w(c) * dz;
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
  std::vector<double> dw, db, losses;  // dw, db per global chunk (reference) or per local chunk (run)
};

// All chunks in one process, micro-batch after micro-batch.
Result reference(const Toy& toy, std::int64_t A) {
  const std::size_t C = std::size_t(toy.chunks());
  Result r{std::vector<double>(C, 0.0), std::vector<double>(C, 0.0), {}};
  for (std::int64_t mb = 0; mb < A; ++mb) {
    std::vector<std::vector<double>> xs{toy.input(mb)}, ys;
    for (int c = 0; c < toy.chunks(); ++c) {
      ys.push_back(toy.forward(c, xs.back()));
      xs.push_back(ys.back());
    }
    const auto cw = toy.loss_weights(mb);
    r.losses.push_back(Toy::loss(cw, ys.back()));
    std::vector<double> dy = cw;
    for (int c = toy.chunks() - 1; c >= 0; --c)
      dy = toy.backward(c, xs[std::size_t(c)], ys[std::size_t(c)], dy, r.dw[std::size_t(c)], r.db[std::size_t(c)]);
  }
  return r;
}

// This rank's chunks under run_1f1b, recording their calls (and, given a count of the
// receives started so far, that count at each computation), and run_1f1b's count of the
// receives it posted ahead.
struct StageRun {
  Result result;
  std::vector<Call> calls;
  std::int64_t max_in_flight = 0;
  std::vector<std::int64_t> recvs_before;  // per computation: the receives started before it
  std::int64_t posted_ahead = 0;
};

// on_compute, when given, runs at each computation with its input (null: none).
StageRun run_stage(Communicator& pp, const Toy& toy, std::int64_t A, const std::int64_t* recvs_started = nullptr,
                   const std::function<void(const Tensor*)>& on_compute = {}) {
  const int s = pp.rank(), P = pp.size(), V = toy.V;
  auto global = [&](int chunk) { return chunk * P + s; };
  StageRun run;
  run.result.dw.assign(std::size_t(V), 0.0);
  run.result.db.assign(std::size_t(V), 0.0);
  std::map<std::pair<int, std::int64_t>, std::pair<std::vector<double>, std::vector<double>>> saved;  // -> (x, y)
  PipelineStage stage;
  stage.chunks = V;
  stage.activation_shape = {toy.n};
  stage.dtype = DType::F64;
  stage.forward = [&](int chunk, std::int64_t mb, const Tensor* input) -> Tensor {
    const int c = global(chunk);
    const bool first = c == 0, last = c == toy.chunks() - 1;
    EXPECT_EQ(input == nullptr, first) << "stage " << s << " chunk " << chunk << " mb " << mb;
    run.calls.push_back({+1, chunk, mb});
    if (recvs_started) run.recvs_before.push_back(*recvs_started);
    if (on_compute) on_compute(input);
    auto x = first ? toy.input(mb) : input->to_vector();
    auto y = toy.forward(c, x);
    saved[{chunk, mb}] = {x, y};
    run.max_in_flight = std::max(run.max_in_flight, std::int64_t(saved.size()));
    if (last) {
      run.result.losses.push_back(Toy::loss(toy.loss_weights(mb), y));
      return Tensor();
    }
    return Tensor::from_vector(y, {toy.n}, DType::F64);
  };
  stage.backward = [&](int chunk, std::int64_t mb, const Tensor* d_output) -> Tensor {
    const int c = global(chunk);
    const bool first = c == 0, last = c == toy.chunks() - 1;
    EXPECT_EQ(d_output == nullptr, last) << "stage " << s << " chunk " << chunk << " mb " << mb;
    run.calls.push_back({-1, chunk, mb});
    if (recvs_started) run.recvs_before.push_back(*recvs_started);
    if (on_compute) on_compute(d_output);
    const auto dy = last ? toy.loss_weights(mb) : d_output->to_vector();
    auto it = saved.find({chunk, mb});
    EXPECT_NE(it, saved.end()) << "backward of chunk " << chunk << " mb " << mb << " before its forward";
    if (it == saved.end()) return first ? Tensor() : Tensor::zeros({toy.n}, DType::F64);
    auto dx = toy.backward(c, it->second.first, it->second.second, dy, run.result.dw[std::size_t(chunk)],
                           run.result.db[std::size_t(chunk)]);
    saved.erase(it);
    return first ? Tensor() : Tensor::from_vector(dx, {toy.n}, DType::F64);
  };
  run.posted_ahead = run_1f1b(pp, A, stage);
  EXPECT_TRUE(saved.empty());
  return run;
}

// `inner` with a count of the receives started through it (start_recv: run_1f1b's receives
// where the backend posts ahead).
class CountingGroup final : public Communicator {
 public:
  explicit CountingGroup(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  std::string backend() const override { return inner_.backend(); }
  bool supports(DType dtype, Device device) const override { return inner_.supports(dtype, device); }
  bool posts_ahead() const override { return inner_.posts_ahead(); }
  std::int64_t recvs_started = 0;
  std::vector<const void*> waited;  // the buffers of the receives waited for, in order

 protected:
  void do_all_reduce(Tensor& t, ReduceOp op) override { inner_.all_reduce(t, op); }
  void do_all_gather(const Tensor& in, Tensor& out, bool) override { inner_.all_gather(in, out); }
  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override { inner_.reduce_scatter(in, out, op); }
  void do_broadcast(Tensor& t, int root) override { inner_.broadcast(t, root); }
  void do_send(const Tensor& t, int peer) override { inner_.send(t, peer); }
  void do_recv(Tensor& t, int peer) override { inner_.recv(t, peer); }
  void do_send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) override {
    inner_.send_recv(send, send_peer, recv, recv_peer);
  }
  void do_barrier() override { inner_.barrier(); }
  Request do_start_send(const Tensor& t, int peer) override { return inner_.start_send(t, peer); }
  Request do_start_recv(Tensor& t, int peer) override {
    ++recvs_started;
    const Request r = inner_.start_recv(t, peer);
    receives_[r] = t.raw();
    return r;
  }
  void do_wait(Request request) override {
    if (auto it = receives_.find(request); it != receives_.end()) {
      waited.push_back(it->second);
      receives_.erase(it);
    }
    inner_.wait(request);
  }

 private:
  Communicator& inner_;
  std::map<Request, const void*> receives_;  // started receives: their buffers
};

// Per computation of `steps`: the receives of the steps before the next computation (those
// before it: received; those after it: posted ahead of it), and their total of the latter.
std::pair<std::vector<std::int64_t>, std::int64_t> expected_posts(const std::vector<PipelineStep>& steps) {
  std::vector<std::int64_t> before;
  std::int64_t received = 0, ahead = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (!is_computation(steps[i].op)) {
      received += has_recv(steps[i].op) ? 1 : 0;
      continue;
    }
    std::int64_t next = 0;
    for (std::size_t j = i + 1; j < steps.size() && !is_computation(steps[j].op); ++j) next += has_recv(steps[j].op);
    before.push_back(received + next);
    ahead += next;
  }
  return {before, ahead};
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

// The run of each chunk against the reference, bit for bit.
void expect_run_matches(const StageRun& run, const Result& ref, int s, int P, int V, std::int64_t A,
                        const std::string& where) {
  for (int v = 0; v < V; ++v) {
    EXPECT_EQ(run.result.dw[std::size_t(v)], ref.dw[std::size_t(v * P + s)]) << where << " chunk " << v;
    EXPECT_EQ(run.result.db[std::size_t(v)], ref.db[std::size_t(v * P + s)]) << where << " chunk " << v;
  }
  if (s == P - 1) {
    EXPECT_EQ(run.result.losses, ref.losses) << where;
  } else {
    EXPECT_TRUE(run.result.losses.empty()) << where;
  }
  EXPECT_EQ(run.calls, expected_calls(s, P, A, V)) << where;
  EXPECT_EQ(run.max_in_flight, expected_in_flight(s, P, A, V)) << where;
}

}  // namespace

TEST(Schedule, NoDeadlockWithBlockingTransfersAndOneFOneBOrder) {
  for (int P = 1; P <= 8; ++P)
    for (std::int64_t A = 0; A <= 16; ++A) {
      EXPECT_EQ(replay(P, A), "") << "P=" << P << " A=" << A;
      EXPECT_EQ(replay(P, A, 1, Kind::ForwardOnly), "") << "P=" << P << " A=" << A;
      for (int s = 0; s < P; ++s) {
        std::int64_t most = 0;
        const auto steps = schedule_1f1b(s, P, A);
        EXPECT_EQ(calls_of(steps, &most), expected_calls(s, P, A)) << "P=" << P << " A=" << A << " stage " << s;
        EXPECT_EQ(most, std::min<std::int64_t>(P - s, A)) << "P=" << P << " A=" << A << " stage " << s;
        for (const PipelineStep& st : steps)
          if (P == 1) {
            EXPECT_TRUE(st.op == PipelineOp::Forward || st.op == PipelineOp::Backward);
          }
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
  EXPECT_EQ(replay(2, 1, 1, Kind::Naive), "");  // no steady exchange with A = 1
  EXPECT_NE(replay(2, 2, 1, Kind::Naive).find("deadlock"), std::string::npos);
  EXPECT_NE(replay(4, 8, 1, Kind::Naive).find("deadlock"), std::string::npos);
}

TEST(Schedule, InterleavedNoDeadlockWithBlockingTransfersAndMegatronOrder) {
  int schedules = 0;
  for (int P = 2; P <= 8; ++P)
    for (int V = 2; V <= 4; ++V)
      for (std::int64_t A = P; A <= 16; A += P) {
        const std::string where = "P=" + std::to_string(P) + " V=" + std::to_string(V) + " A=" + std::to_string(A);
        EXPECT_EQ(replay(P, A, V), "") << where;
        EXPECT_EQ(replay(P, A, V, Kind::ForwardOnly), "") << where;
        ++schedules;
        for (int s = 0; s < P; ++s) {
          std::int64_t most = 0;
          const std::vector<Call> calls = calls_of(schedule_interleaved(s, P, A, V), &most);
          EXPECT_EQ(calls, expected_calls(s, P, A, V)) << where << " stage " << s;
          EXPECT_TRUE(each_chunk_in_order(calls, V, A)) << where << " stage " << s;
          EXPECT_EQ(most, expected_in_flight(s, P, A, V)) << where << " stage " << s;
          std::int64_t none = 0;
          std::vector<Call> forwards;
          for (const Call& c : calls)
            if (c.dir > 0) forwards.push_back(c);
          EXPECT_EQ(calls_of(schedule_forward(s, P, A, V), &none), forwards) << where << " stage " << s;
        }
        // Lockstep slots: every rank is busy A V slots of each direction, and the bubble is
        // 2 (P - 1) slots (P - 1 of each direction), as the bubble fraction counts it.
        const auto table = interleaved_slots(P, A, V);
        const std::size_t slots = table[0].size();
        for (const auto& rank : table) {
          EXPECT_EQ(rank.size(), slots) << where;
          EXPECT_EQ(std::count_if(rank.begin(), rank.end(), [](const auto& w) { return w.has_value(); }), 2 * A * V)
              << where;
        }
        EXPECT_EQ(std::int64_t(slots), 2 * A * V + 2 * (P - 1)) << where;
      }
  EXPECT_EQ(schedules, 3 * (8 + 5 + 4 + 3 + 2 + 2 + 2));  // V in 2..4 times the (P, A) pairs
  // The tables of the header (printed for core/comm/pipeline_schedule.h).
  if (world_rank() == 0) std::printf("P=4 V=2 A=4:\n%s", slot_table(4, 4, 2).c_str());
  // Ideal timing with unit slots: the interleaved order gives the (P - 1) / (V A) bubble.
  EXPECT_EQ(interleaved_slots(4, 4, 2)[0].size(), std::size_t(2 * 4 * 2 + 2 * 3));
  EXPECT_EQ(interleaved_slots(4, 8, 2)[0].size(), std::size_t(2 * 8 * 2 + 2 * 3));
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 8, 2), 3.0 / 16);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 8, 1), 3.0 / 8);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(1, 8, 1), 0.0);
  // Refused shapes: A not a multiple of P, one stage with several chunks.
  EXPECT_THROW(schedule_interleaved(0, 2, 3, 2), std::logic_error);
  EXPECT_THROW(schedule_interleaved(0, 1, 4, 2), std::logic_error);
  EXPECT_THROW(schedule_interleaved(0, 2, 4, 1), std::logic_error);
  // The replay catches a deadlock here too: the naive pairing of the ring exchanges.
  EXPECT_NE(replay(4, 8, 2, Kind::Naive).find("deadlock"), std::string::npos);
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
        expect_run_matches(run, ref, s, P, 1, A, where);
        EXPECT_LE(run.max_in_flight, P - s) << where;
      }
  }
}

// The interleaved schedule gives each chunk the bits one process gives it, and the same
// bits as V = 1 on the same chain of chunks (the non-interleaved pipeline of P V stages is
// itself bit-exact against one process, above).
TEST(Pipeline, InterleavedMatchesOneProcessExactly) {
  for (auto [tp, pp] : layouts()) {
    if (pp < 2) continue;
    ProcessGroups g = make_process_groups(Backend::Mpi, tp, pp);
    const int s = g.pp->rank(), P = g.pp->size();
    for (int V : {2, 3})
      for (std::int64_t n : {std::int64_t(6), std::int64_t(1) << 16})  // 48 B and 512 KiB messages
        for (std::int64_t A = P; A <= 8; A += P) {
          const std::string where = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " V=" +
                                    std::to_string(V) + " stage " + std::to_string(s) + " n=" + std::to_string(n) +
                                    " A=" + std::to_string(A);
          const Toy toy{P, n, g.layout.dp_rank, V};
          const Result ref = reference(toy, A);
          const StageRun run = run_stage(*g.pp, toy, A);
          expect_run_matches(run, ref, s, P, V, A, where);
        }
  }
}

// Over MPI every receive of run_1f1b is started before the computation ahead of it (the
// blocking steps started it after), with the same bits and calls as ever.
TEST(Pipeline, ReceivesArePostedAheadOfTheComputationBeforeThem) {
  for (auto [tp, pp] : layouts()) {
    if (pp < 2) continue;
    ProcessGroups g = make_process_groups(Backend::Mpi, tp, pp);
    ASSERT_TRUE(g.pp->posts_ahead());
    const int s = g.pp->rank(), P = g.pp->size();
    for (int V : {1, 2})
      for (std::int64_t A : {P, 2 * P}) {
        const std::string where = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " V=" +
                                  std::to_string(V) + " stage " + std::to_string(s) + " A=" + std::to_string(A);
        const Toy toy{P, std::int64_t(1) << 16, g.layout.dp_rank, V};  // 512 KiB messages
        CountingGroup counting(*g.pp);
        const StageRun run = run_stage(counting, toy, A, &counting.recvs_started);
        expect_run_matches(run, reference(toy, A), s, P, V, A, where);
        const auto [before, ahead] = expected_posts(schedule_pipeline(s, P, A, V));
        EXPECT_EQ(run.recvs_before, before) << where;
        EXPECT_EQ(run.posted_ahead, ahead) << where;
        EXPECT_GT(run.posted_ahead, 0) << where;
      }
  }
}

// Posted ahead, each receive is waited for by the computation that reads it: between two
// computations, exactly the wait for the second one's input (none before the first stage's
// first chunk's forwards and the last stage's last chunk's backwards). In the interleaved
// schedule a message often arrives slots before its use, so a wait at its transfer step would
// come earlier (and hold the stage to its neighbour's pace there).
TEST(Pipeline, ReceivesAreWaitedForByTheComputationThatReadsThem) {
  for (auto [tp, pp] : layouts()) {
    if (pp < 2) continue;
    ProcessGroups g = make_process_groups(Backend::Mpi, tp, pp);
    const int s = g.pp->rank(), P = g.pp->size();
    for (int V : {1, 2})
      for (std::int64_t A : {P, 2 * P}) {
        const std::string where = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " V=" +
                                  std::to_string(V) + " stage " + std::to_string(s) + " A=" + std::to_string(A);
        const Toy toy{P, 64, g.layout.dp_rank, V};
        CountingGroup counting(*g.pp);
        int bad = 0;
        const StageRun run = run_stage(counting, toy, A, nullptr, [&](const Tensor* input) {
          const std::vector<const void*> want = input ? std::vector<const void*>{input->raw()} : std::vector<const void*>{};
          if (counting.waited != want && bad++ < 3)
            ADD_FAILURE() << where << ": computation " << counting.recvs_started << " waited for "
                          << counting.waited.size() << " receive(s), not just its input's";
          counting.waited.clear();
        });
        expect_run_matches(run, reference(toy, A), s, P, V, A, where);
        EXPECT_EQ(bad, 0) << where;
        EXPECT_TRUE(counting.waited.empty()) << where << ": receives waited for after the last computation";
      }
  }
}

// A group of one: no transfers, nothing posted ahead.
TEST(Pipeline, OneStageIsForwardThenBackward) {
  SingleCommunicator pp("pp");
  const Toy toy{1, 5, 3};
  const StageRun run = run_stage(pp, toy, 4);
  EXPECT_EQ(run.posted_ahead, 0);
  const Result ref = reference(toy, 4);
  EXPECT_EQ(run.result.dw[0], ref.dw[0]);
  EXPECT_EQ(run.result.losses, ref.losses);
  EXPECT_EQ(run.calls, (std::vector<Call>{{1, 0, 0}, {-1, 0, 0}, {1, 0, 1}, {-1, 0, 1}, {1, 0, 2}, {-1, 0, 2}, {1, 0, 3}, {-1, 0, 3}}));
  EXPECT_EQ(run.max_in_flight, 1);
}

TEST(Pipeline, ForwardOnlyMatchesOneProcessExactly) {
  for (auto [tp, pp] : layouts())
    for (int V : {1, 2, 3}) {
      if (V > 1 && pp < 2) continue;
      ProcessGroups g = make_process_groups(Backend::Mpi, tp, pp);
      const int s = g.pp->rank(), P = g.pp->size();
      for (std::int64_t n : {std::int64_t(6), std::int64_t(1) << 16})
        for (std::int64_t A : {1, 2, 3, 4, 8}) {
          if (A % P != 0 && V > 1) continue;
          const Toy toy{P, n, g.layout.dp_rank, V};
          const Result ref = reference(toy, A);
          std::vector<double> losses;
          std::vector<std::vector<std::int64_t>> order(static_cast<std::size_t>(V));
          run_pipeline_forward(
              *g.pp, A,
              [&](int chunk, std::int64_t mb, const Tensor* input) -> Tensor {
                const int c = chunk * P + s;
                EXPECT_EQ(input == nullptr, c == 0);
                order[std::size_t(chunk)].push_back(mb);
                const auto y = toy.forward(c, c == 0 ? toy.input(mb) : input->to_vector());
                if (c == toy.chunks() - 1) {
                  losses.push_back(Toy::loss(toy.loss_weights(mb), y));
                  return Tensor();
                }
                return Tensor::from_vector(y, {n}, DType::F64);
              },
              {n}, DType::F64, Device::CPU, V);
          std::vector<std::int64_t> in_order(static_cast<std::size_t>(A));
          for (std::int64_t i = 0; i < A; ++i) in_order[std::size_t(i)] = i;
          for (int v = 0; v < V; ++v) EXPECT_EQ(order[std::size_t(v)], in_order);
          if (s == P - 1) {
            EXPECT_EQ(losses, ref.losses) << "tp=" << tp << " pp=" << pp << " V=" << V << " A=" << A;
          }
        }
    }
}
