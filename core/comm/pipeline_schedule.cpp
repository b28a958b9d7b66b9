#include "core/comm/pipeline_schedule.h"

#include <algorithm>

#include "core/util/error.h"

namespace nsatron::parallel {

void check_pipeline_shape(int stage, int stages, std::int64_t micro_batches, int chunks) {
  NSA_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pipeline schedule: stage ", stage, " of ", stages);
  NSA_CHECK(micro_batches >= 0, "pipeline schedule: ", micro_batches, " micro-batches");
  NSA_CHECK(chunks >= 1, "pipeline schedule: ", chunks, " model chunks per stage");
  if (chunks > 1) {
    NSA_CHECK(stages >= 2, "pipeline schedule: ", chunks, " model chunks per stage need at least 2 stages");
    NSA_CHECK(micro_batches % stages == 0, "pipeline schedule: the interleaved schedule needs the micro-batches (",
              micro_batches, ") to be a multiple of the stages (", stages, ")");
  }
}

std::vector<PipelineStep> schedule_1f1b(int stage, int stages, std::int64_t micro_batches) {
  check_pipeline_shape(stage, stages, micro_batches, 1);
  const bool first = stage == 0, last = stage == stages - 1;
  const std::int64_t A = micro_batches;
  const std::int64_t W = std::min<std::int64_t>(stages - stage - 1, A);  // warmup forwards
  const std::int64_t R = A - W;                                          // steady iterations
  std::vector<PipelineStep> steps;
  using Op = PipelineOp;
  // Warmup: forwards only.
  for (std::int64_t f = 0; f < W; ++f) {
    if (!first) steps.push_back({Op::RecvForward, f, -1});
    steps.push_back({Op::Forward, f, -1});
    if (!last) steps.push_back({Op::SendForward, f, -1});
  }
  // Steady: one forward, one backward. The input of the first steady forward is received
  // alone; each later one comes with the previous backward's input gradient.
  if (R > 0 && !first) steps.push_back({Op::RecvForward, W, -1});
  for (std::int64_t i = 0; i < R; ++i) {
    const std::int64_t f = W + i, b = i;
    steps.push_back({Op::Forward, f, -1});
    if (!last) steps.push_back({Op::SendForwardRecvBackward, f, b});
    steps.push_back({Op::Backward, -1, b});
    if (!first) {
      if (i + 1 < R)
        steps.push_back({Op::SendBackwardRecvForward, f + 1, b});
      else
        steps.push_back({Op::SendBackward, -1, b});
    }
  }
  // Cooldown: the backwards of the warmup's micro-batches.
  for (std::int64_t b = R; b < A; ++b) {
    if (!last) steps.push_back({Op::RecvBackward, -1, b});
    steps.push_back({Op::Backward, -1, b});
    if (!first) steps.push_back({Op::SendBackward, -1, b});
  }
  return steps;
}

std::int64_t interleaved_warmup(int stage, int stages, std::int64_t micro_batches, int chunks) {
  check_pipeline_shape(stage, stages, micro_batches, chunks);
  const std::int64_t W = 2 * std::int64_t(stages - stage - 1) + std::int64_t(chunks - 1) * stages;
  return std::min<std::int64_t>(W, micro_batches * chunks);
}

std::vector<ChunkWork> interleaved_order(int stage, int stages, std::int64_t micro_batches, int chunks) {
  const std::int64_t K = micro_batches * chunks, W = interleaved_warmup(stage, stages, micro_batches, chunks);
  const std::int64_t P = stages, PV = P * chunks;
  auto work = [&](std::int64_t k, bool backward) {
    const int v = int((k % PV) / P);
    return ChunkWork{backward, backward ? chunks - 1 - v : v, (k / PV) * P + k % P};
  };
  std::vector<ChunkWork> order;
  for (std::int64_t k = 0; k < W; ++k) order.push_back(work(k, false));
  for (std::int64_t i = 0; i < K - W; ++i) {
    order.push_back(work(W + i, false));
    order.push_back(work(i, true));
  }
  for (std::int64_t k = K - W; k < K; ++k) order.push_back(work(k, true));
  return order;
}

namespace {

using Slots = std::vector<std::vector<const ChunkWork*>>;  // per rank, its work per slot (nullptr: idle)

// The lockstep construction (the header): every rank's computations placed in slots.
// `orders[s]`: rank s's computations in order (the result points into them).
Slots lockstep_slots(int stages, std::int64_t micro_batches, int chunks,
                     const std::vector<std::vector<ChunkWork>>& orders) {
  const int P = stages, V = chunks;
  const std::int64_t A = micro_batches, C = std::int64_t(P) * V;  // C: the global chunks
  // The slot at which (global chunk, mb) was forwarded / backwarded (-1: not yet).
  std::vector<std::int64_t> fwd_at(std::size_t(C * A), -1), bwd_at(std::size_t(C * A), -1);
  auto at = [&](std::int64_t c, std::int64_t m) { return std::size_t(c * A + m); };
  std::vector<std::size_t> pos(std::size_t(P), 0);
  Slots slots(static_cast<std::size_t>(P));
  for (std::int64_t t = 0;; ++t) {
    bool left = false, ran = false;
    std::vector<const ChunkWork*> now(std::size_t(P), nullptr);
    for (int s = 0; s < P; ++s) {
      const auto& order = orders[std::size_t(s)];
      if (pos[std::size_t(s)] == order.size()) continue;
      left = true;
      const ChunkWork& w = order[pos[std::size_t(s)]];
      const std::int64_t c = std::int64_t(w.chunk) * P + s;
      auto done_before = [&](const std::vector<std::int64_t>& when, std::int64_t cc) {
        const std::int64_t x = when[at(cc, w.mb)];
        return x >= 0 && x < t;
      };
      const bool ready = !w.backward ? (c == 0 || done_before(fwd_at, c - 1))
                                     : (c == C - 1 ? done_before(fwd_at, c) : done_before(bwd_at, c + 1));
      if (ready) now[std::size_t(s)] = &w;
    }
    if (!left) break;
    for (int s = 0; s < P; ++s) {
      const ChunkWork* w = now[std::size_t(s)];
      slots[std::size_t(s)].push_back(w);
      if (!w) continue;
      ran = true;
      ++pos[std::size_t(s)];
      (w->backward ? bwd_at : fwd_at)[at(std::int64_t(w->chunk) * P + s, w->mb)] = t;
    }
    NSA_CHECK(ran, "pipeline schedule: the interleaved order deadlocks (P=", P, " V=", V, " A=", A, ")");
  }
  return slots;
}

// Rank `stage`'s steps from the slots: per slot its computation, its part of the forward
// exchange and of the backward exchange.
std::vector<PipelineStep> lockstep_steps(int stage, int stages, int chunks, const Slots& slots) {
  const int P = stages;
  const std::int64_t C = std::int64_t(P) * chunks;
  // This rank's steps.
  using Op = PipelineOp;
  const int s = stage, prev = prev_stage(s, P), next = next_stage(s, P);
  std::vector<PipelineStep> steps;
  for (std::size_t t = 0; t < slots[std::size_t(s)].size(); ++t) {
    const ChunkWork* mine = slots[std::size_t(s)][t];
    const ChunkWork* before = t < slots[std::size_t(prev)].size() ? slots[std::size_t(prev)][t] : nullptr;
    const ChunkWork* after = t < slots[std::size_t(next)].size() ? slots[std::size_t(next)][t] : nullptr;
    auto global = [&](const ChunkWork* w, int rank) { return std::int64_t(w->chunk) * P + rank; };
    if (mine) {
      if (mine->backward) steps.push_back({Op::Backward, -1, mine->mb, 0, mine->chunk});
      else steps.push_back({Op::Forward, mine->mb, -1, mine->chunk, 0});
    }
    // Forward exchange: this slot's output to the next rank, the previous rank's in.
    const bool send_f = mine && !mine->backward && global(mine, s) < C - 1;
    const bool recv_f = before && !before->backward && global(before, prev) < C - 1;
    const int in_chunk = recv_f ? int((global(before, prev) + 1) / P) : 0;
    if (send_f && recv_f)
      steps.push_back({Op::SendForwardRecvForward, mine->mb, -1, mine->chunk, 0, before->mb, in_chunk});
    else if (send_f)
      steps.push_back({Op::SendForward, mine->mb, -1, mine->chunk, 0});
    else if (recv_f)
      steps.push_back({Op::RecvForward, before->mb, -1, in_chunk, 0});
    // Backward exchange: this slot's input gradient to the previous rank, the next rank's in.
    const bool send_b = mine && mine->backward && global(mine, s) > 0;
    const bool recv_b = after && after->backward && global(after, next) > 0;
    const int grad_chunk = recv_b ? int((global(after, next) - 1) / P) : 0;
    if (send_b && recv_b)
      steps.push_back({Op::SendBackwardRecvBackward, -1, mine->mb, 0, mine->chunk, after->mb, grad_chunk});
    else if (send_b)
      steps.push_back({Op::SendBackward, -1, mine->mb, 0, mine->chunk});
    else if (recv_b)
      steps.push_back({Op::RecvBackward, -1, after->mb, 0, grad_chunk});
  }
  return steps;
}

}  // namespace

namespace {

// Every rank's computations in order: the interleaved order, or its forwards only.
std::vector<std::vector<ChunkWork>> all_orders(int stages, std::int64_t micro_batches, int chunks, bool forward_only) {
  std::vector<std::vector<ChunkWork>> orders;
  for (int s = 0; s < stages; ++s) {
    std::vector<ChunkWork> order = interleaved_order(s, stages, micro_batches, chunks);
    if (forward_only) std::erase_if(order, [](const ChunkWork& w) { return w.backward; });
    orders.push_back(std::move(order));
  }
  return orders;
}

}  // namespace

std::vector<PipelineStep> schedule_interleaved(int stage, int stages, std::int64_t micro_batches, int chunks) {
  check_pipeline_shape(stage, stages, micro_batches, chunks);
  NSA_CHECK(chunks >= 2, "schedule_interleaved: ", chunks, " model chunk(s) per stage (1: schedule_1f1b)");
  const auto orders = all_orders(stages, micro_batches, chunks, false);
  return lockstep_steps(stage, stages, chunks, lockstep_slots(stages, micro_batches, chunks, orders));
}

std::vector<PipelineStep> schedule_pipeline(int stage, int stages, std::int64_t micro_batches, int chunks) {
  return chunks == 1 ? schedule_1f1b(stage, stages, micro_batches)
                     : schedule_interleaved(stage, stages, micro_batches, chunks);
}

std::vector<PipelineStep> schedule_forward(int stage, int stages, std::int64_t micro_batches, int chunks) {
  check_pipeline_shape(stage, stages, micro_batches, chunks);
  if (chunks == 1) {
    using Op = PipelineOp;
    std::vector<PipelineStep> steps;
    for (std::int64_t m = 0; m < micro_batches; ++m) {
      if (stage > 0) steps.push_back({Op::RecvForward, m, -1});
      steps.push_back({Op::Forward, m, -1});
      if (stage < stages - 1) steps.push_back({Op::SendForward, m, -1});
    }
    return steps;
  }
  const auto orders = all_orders(stages, micro_batches, chunks, true);
  return lockstep_steps(stage, stages, chunks, lockstep_slots(stages, micro_batches, chunks, orders));
}

std::vector<std::vector<std::optional<ChunkWork>>> interleaved_slots(int stages, std::int64_t micro_batches, int chunks,
                                                                     bool forward_only) {
  check_pipeline_shape(0, stages, micro_batches, chunks);
  const auto orders = all_orders(stages, micro_batches, chunks, forward_only);
  std::vector<std::vector<std::optional<ChunkWork>>> table;
  for (const auto& rank : lockstep_slots(stages, micro_batches, chunks, orders)) {
    table.emplace_back();
    for (const ChunkWork* w : rank) table.back().push_back(w ? std::optional<ChunkWork>(*w) : std::nullopt);
  }
  return table;
}

bool is_computation(PipelineOp op) { return op == PipelineOp::Forward || op == PipelineOp::Backward; }

bool has_send(PipelineOp op) {
  return !is_computation(op) && op != PipelineOp::RecvForward && op != PipelineOp::RecvBackward;
}

bool has_recv(PipelineOp op) {
  return !is_computation(op) && op != PipelineOp::SendForward && op != PipelineOp::SendBackward;
}

std::vector<PipelineEvent> pipeline_events(const std::vector<PipelineStep>& steps, bool ahead) {
  using Kind = PipelineEvent::Kind;
  std::vector<PipelineEvent> events;
  if (!ahead) {
    for (std::size_t i = 0; i < steps.size(); ++i) {
      events.push_back({Kind::Step, i});
      if (has_send(steps[i].op)) events.push_back({Kind::WaitSends, i + 1});
    }
    return events;
  }
  std::vector<bool> posted(steps.size(), false);
  bool sending = false;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const PipelineOp op = steps[i].op;
    if (is_computation(op)) {
      for (std::size_t j = i + 1; j < steps.size() && !is_computation(steps[j].op); ++j)
        if (has_recv(steps[j].op)) {
          events.push_back({Kind::PostRecv, j});
          posted[j] = true;
        }
    } else if (has_send(op) && sending) {
      events.push_back({Kind::WaitSends, i});
    }
    if (has_send(op)) sending = true;
    events.push_back({Kind::Step, i, posted[i]});
  }
  if (sending) events.push_back({Kind::WaitSends, steps.size()});
  return events;
}

double pipeline_bubble_fraction(int stages, std::int64_t micro_batches, int chunks) {
  if (stages <= 1 || micro_batches <= 0) return 0.0;
  return double(stages - 1) / (double(chunks) * double(micro_batches));
}

}  // namespace nsatron::parallel
