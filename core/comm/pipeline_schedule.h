// The pipeline schedules as data: for one rank of a pipeline of P ranks (stages), the ordered
// list of its computations (the forward or backward of one model chunk on one micro-batch) and
// of its transfers to and from its neighbours. parallel/pipeline.h executes these lists over a
// Communicator; the memory plan (core/model/plan.h) replays them on a ledger; the tests replay
// every rank's list together with blocking transfers. Nothing here communicates: the lists
// live in core/ so that the model's memory plan and the parallel layer read the same ones.
//
// The model is cut into P * V contiguous chunks ("virtual stages"), V = `chunks` per rank;
// global chunk c (0-based) runs on rank c % P as its local chunk c / P (Megatron's
// assignment). V = 1 is the plain pipeline: rank s holds stage s. Activations go from chunk c
// to c + 1, i.e. from rank s to its next rank (s + 1) % P; their gradients from chunk c + 1
// back to c, to the previous rank (s - 1 + P) % P. With V = 1 no transfer wraps around; with
// V > 1 the last rank's chunks feed the first rank's next chunks (a ring).
//
// ---- V = 1: 1F1B (Megatron's non-interleaved one-forward-one-backward) -----------------------
//
// Stage s, with W = min(P - s - 1, A) warmup micro-batches:
//   warmup    W times:      recv input from s-1, forward, send output to s+1
//   steady    A - W times:  forward mb f, then backward mb b (f = W + i, b = i):
//                             the output of f goes to s+1 and the gradient of b comes back from
//                             s+1 in one send_recv; the input gradient of b goes to s-1 and the
//                             input of f + 1 comes from s-1 in one send_recv (the last
//                             iteration only sends)
//   cooldown  W times:      recv output gradient from s+1, backward, send input gradient to s-1
// The first stage has no s-1 (no input: forward gets nullptr, its input gradients are dropped),
// the last no s+1 (its output is dropped; backward gets nullptr: the loss is its own).
//
// Order of the calls for P = 4, A = 6, F and B taking one slot each and messages free
// (the last stage alternates from the start; stage s starts with P - s - 1 forwards):
//   stage 0: F0 F1 F2 F3 .. .. .. B0 F4 B1 F5 B2 .. B3 .. B4 .. B5
//   stage 1: .. F0 F1 F2 .. .. B0 F3 B1 F4 B2 F5 B3 .. B4 .. B5 ..
//   stage 2: .. .. F0 F1 .. B0 F2 B1 F3 B2 F4 B3 F5 B4 .. B5 .. ..
//   stage 3: .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 .. .. ..
// (the bubble: P - 1 slots of each direction per step, so A >> P keeps the stages busy).
//
// Memory: stage s holds at most min(P - s, A) micro-batches in flight (forwarded and not yet
// backwarded): W + 1 at the end of the warmup, and each steady iteration adds one and
// retires one. The first stage holds the most; the last holds one.
//
// Deadlock: every transfer is a blocking send, recv or send_recv (MPI_Sendrecv), which MPI may
// complete only once the peer has posted the matching receive (large messages); NCCL enqueues
// them on the stream, where a send waits for its peer's receive the same way. The pairing
// above never waits in a cycle, for any P and A (A < P included: no steady phase, the warmup
// and cooldown are a chain).
//
// ---- V > 1: interleaved 1F1B (Megatron's schedule with virtual stages) ----------------------
//
// Needs P >= 2 and A a multiple of P. Each rank runs A * V chunk-forwards and as many
// chunk-backwards, in Megatron's order: its k-th forward (k = 0 .. A V - 1) is local chunk
// (k mod P V) / P on micro-batch (k / (P V)) P + k mod P, so the micro-batches go through
// the rank's chunks in groups of P (chunk 0 on mb 0..P-1, chunk 1 on mb 0..P-1, ..., then mb
// P..2P-1); its k-th backward is the same with the chunks in reverse (local chunk V - 1 -
// (k mod P V) / P). Rank s first runs W = min(2 (P - s - 1) + (V - 1) P, A V) forwards, then
// alternates one forward and one backward, then finishes the backwards. Every chunk is
// forwarded and backwarded on micro-batches 0, 1, ..., A - 1 in increasing order, so each
// parameter accumulates its micro-batches' gradients in the order one process would, and the
// last chunk adds the micro-batches' losses in that order: the same bits as V = 1 (and as one
// process) wherever the non-interleaved pipeline gives them.
//
// Timing and transfers (the lockstep construction): the step is cut into slots. In each slot
// every rank runs the next computation of its order if its input is there (the previous
// chunk's output, received in an earlier slot; for a backward, the next chunk's input
// gradient, or on the last chunk its own forward), else idles. After the slot's computation,
// every rank takes part in two exchanges, in this order on every rank:
//   forward exchange   the output of this slot's forward (unless it is the last chunk) goes
//                      to the next rank, and the output of the previous rank's forward of this
//                      slot (unless the last chunk's) comes in: one send_recv, or one send or
//                      one recv when only one half exists, or nothing
//   backward exchange  the input gradient of this slot's backward (unless of chunk 0) goes to
//                      the previous rank, and the next rank's comes in, likewise
// A message is received in the slot its producer runs and waits, if need be, until its
// chunk uses it (Megatron receives them as early). Order of the calls for P = 4, V = 2,
// A = 4 (Fv.m: forward of local chunk v on micro-batch m; B likewise; one slot each):
//   rank 0: F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 ..   ..   ..   B1.0 ..   B1.1 ..   B1.2 ..   B1.3 B0.0 B0.1 B0.2 B0.3
//   rank 1: ..   F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 ..   B1.0 ..   B1.1 ..   B1.2 ..   B1.3 B0.0 B0.1 B0.2 B0.3 ..
//   rank 2: ..   ..   F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 B1.0 F1.3 B1.1 ..   B1.2 ..   B1.3 B0.0 B0.1 B0.2 B0.3 ..   ..
//   rank 3: ..   ..   ..   F0.0 F0.1 F0.2 F0.3 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3 B0.0 B0.1 B0.2 B0.3 ..   ..   ..
// (global chunk c = 4 v + rank: chunk 0 on rank 0 takes the tokens, chunk 7 = rank 3's F1/B1
// computes the loss; tests/parallel/test_pipeline.cpp prints this table): 22 slots, 16 of them
// busy on every rank. The bubble of a step is P - 1 slots of each direction against A V busy
// ones, i.e. (P - 1) / (V A) of the step's ideal time (the time without bubbles; slots of
// equal length here, but the fraction holds for any forward and backward times), against
// (P - 1) / A with V = 1 (the 1F1B table above: 18 slots, 12 busy): V times smaller, for V
// times the messages (every micro-batch crosses the ring V times). With unit slots the
// construction takes exactly 2 A V + 2 (P - 1) slots for every P, V and A tested (some ranks
// idle inside the steady phase when A > P and catch up at the end).
//
// Memory: rank s holds at most min(W + 1, A V) chunk-micro-batches in flight, W as above
// (its chunks' activations are each about 1/V of a V = 1 stage's), plus the messages
// received ahead of their use.
//
// Deadlock: every rank makes its exchanges in the same global order (slot by slot, forward
// before backward), each exchange pairs a send only with the receive its peer makes in the
// same exchange, and there is at most one message per exchange on each directed pair of
// ranks, so the n-th message from a to b is the n-th receive b posts from a (messages carry
// no tags; with P = 2 the next and previous rank are one rank, and its one channel carries
// activations and gradients alike, in the order of the exchanges). Take the first exchange
// at which some rank would wait forever: every rank has finished the earlier ones, so every
// participant reaches this one (computations always finish), posts its halves, and the
// exchange completes, a contradiction. So no deadlock for any P, V and A; the tests replay
// every rank's list with blocking transfers for P <= 8, V <= 4, A multiples of P up to 16.
//
// Forward only (evaluation): V = 1: for each micro-batch in order, recv input from s-1,
// forward, send output to s+1 (stages overlap as a chain). V > 1: the forwards of the
// interleaved order (all A V of them, no backwards) in the same lockstep slots and forward
// exchanges.
//
// With P == 1 (V must be 1): for each micro-batch, forward then backward, with no
// communication.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nsatron::parallel {

enum class PipelineOp {
  RecvForward,              // recv the input of (fwd_chunk, fwd_mb) from the previous rank
  Forward,                  // forward of (fwd_chunk, fwd_mb)
  SendForward,              // send the output of (fwd_chunk, fwd_mb) to the next rank
  SendForwardRecvBackward,  // V = 1: send_recv with s+1: the output of fwd_mb out, the gradient of bwd_mb in
  Backward,                 // backward of (bwd_chunk, bwd_mb)
  SendBackward,             // send the input gradient of (bwd_chunk, bwd_mb) to the previous rank
  RecvBackward,             // recv the output gradient of (bwd_chunk, bwd_mb) from the next rank
  SendBackwardRecvForward,  // V = 1: send_recv with s-1: the input gradient of bwd_mb out, the input of fwd_mb in
  SendForwardRecvForward,   // V > 1: the output of (fwd_chunk, fwd_mb) to the next rank, the input of
                            //   (recv_chunk, recv_mb) from the previous rank, in one send_recv
  SendBackwardRecvBackward, // V > 1: the input gradient of (bwd_chunk, bwd_mb) to the previous rank, the
                            //   output gradient of (recv_chunk, recv_mb) from the next rank, in one send_recv
};

struct PipelineStep {
  PipelineOp op;
  std::int64_t fwd_mb = -1;  // the micro-batch of the forward or activation (-1: none)
  std::int64_t bwd_mb = -1;  // the micro-batch of the backward or gradient (-1: none)
  int fwd_chunk = 0, bwd_chunk = 0;  // their local model chunks (0 with V = 1)
  std::int64_t recv_mb = -1;         // SendForwardRecvForward, SendBackwardRecvBackward: what comes in
  int recv_chunk = 0;
};

// One computation of a rank: the forward or backward of its local chunk on a micro-batch.
struct ChunkWork {
  bool backward = false;
  int chunk = 0;
  std::int64_t mb = 0;
  bool operator==(const ChunkWork&) const = default;
};

// The next and previous rank of `stage` in the ring of `stages`.
inline int next_stage(int stage, int stages) { return (stage + 1) % stages; }
inline int prev_stage(int stage, int stages) { return (stage + stages - 1) % stages; }

// Throws std::logic_error unless 0 <= stage < stages, micro_batches >= 0, chunks >= 1, and
// with chunks > 1: stages >= 2 and micro_batches a multiple of stages.
void check_pipeline_shape(int stage, int stages, std::int64_t micro_batches, int chunks);

// The steps of stage `stage` of `stages` for `micro_batches`, in order, without the transfers
// to a stage that does not exist (none at all when stages == 1): 1F1B (chunks == 1).
std::vector<PipelineStep> schedule_1f1b(int stage, int stages, std::int64_t micro_batches);
// The interleaved 1F1B of `chunks` >= 2 model chunks per rank (above).
std::vector<PipelineStep> schedule_interleaved(int stage, int stages, std::int64_t micro_batches, int chunks);
// schedule_1f1b for chunks == 1, else schedule_interleaved.
std::vector<PipelineStep> schedule_pipeline(int stage, int stages, std::int64_t micro_batches, int chunks);
// Forward only (evaluation): Forward steps and their transfers.
std::vector<PipelineStep> schedule_forward(int stage, int stages, std::int64_t micro_batches, int chunks);

// The order of a rank's computations under the interleaved schedule (chunks >= 1: with
// chunks == 1 this is not 1F1B's warmup, which schedule_1f1b has), and its warmup count W.
std::vector<ChunkWork> interleaved_order(int stage, int stages, std::int64_t micro_batches, int chunks);
std::int64_t interleaved_warmup(int stage, int stages, std::int64_t micro_batches, int chunks);
// The lockstep slots of the interleaved schedule (or of its forwards only): per rank, the
// computation of each slot (nullopt: idle), all ranks with the same number of slots.
std::vector<std::vector<std::optional<ChunkWork>>> interleaved_slots(int stages, std::int64_t micro_batches, int chunks,
                                                                     bool forward_only = false);

// ---- Receives posted ahead, sends completed late ---------------------------------------------
//
// run_1f1b executes a rank's steps as events: before each computation it posts the receives
// of the transfer steps that follow it up to the next computation (their buffers are allocated
// there, and a backend that posts ahead, MPI, has them in flight during the computation); at
// a transfer step it waits for its receive (posted then if no computation came before it) and
// starts its send; a started send is completed just before the next transfer step that sends,
// or at the end of the list, so that it too runs during the next computation. The messages
// between two ranks are still started in the order of the steps (receives by their step, sends
// by theirs), so they pair as the blocking steps do; the data and the bits are the same, and
// the memory plan (core/model/plan.cpp) replays these events: a posted receive's buffer and a
// sent message live one computation longer than with blocking transfers.
struct PipelineEvent {
  enum class Kind {
    PostRecv,   // allocate the receive buffer of steps[step] and post its receive
    WaitSends,  // complete the sends started so far (their buffers are released)
    Step,       // steps[step]: a computation, or a transfer (wait for its receive, start its send)
  };
  Kind kind;
  std::size_t step = 0;
  bool recv_posted = false;  // Step of a transfer with a receive: posted by an earlier PostRecv
};

bool is_computation(PipelineOp op);
bool has_send(PipelineOp op);
bool has_recv(PipelineOp op);
// The events of `steps` (above), ending with a WaitSends when a send was started. ahead ==
// false (a backend that does not post ahead: NCCL): the blocking steps as they always were,
// each transfer at its step with its buffers allocated there and a WaitSends right after
// each send (the lifetimes of blocking transfers).
std::vector<PipelineEvent> pipeline_events(const std::vector<PipelineStep>& steps, bool ahead);

// The pipeline bubble as a fraction of a step's ideal time (every rank busy throughout):
// (P - 1) / (V A). 0 with one stage.
double pipeline_bubble_fraction(int stages, std::int64_t micro_batches, int chunks);

// One pipeline message (a micro-batch's activations or their gradient at a stage boundary:
// micro_batch x seq_len x C elements of elem_bytes), as the transport sends it and the memory
// plan counts its receive slots.
inline std::int64_t pipeline_message_bytes(std::int64_t micro_batch, std::int64_t seq_len, std::int64_t C,
                                           std::int64_t elem_bytes) {
  return micro_batch * seq_len * C * elem_bytes;
}
// The copy-engine transport's receive slots per pipeline neighbour
// (parallel/copy_engine_communicator.h): more than the messages a stage receives ahead of their
// use (at most W + 1 <= P V + P - 1, W the interleaved warmup above), so that a copy never waits
// for the compute it precedes.
inline int copy_engine_slots(int stages, int chunks) { return 2 * stages * chunks + 2; }
// Its device memory per neighbour for messages of `message_bytes`: the slots, each rounded up
// to 256 bytes, and two 4-byte flags per slot.
inline std::int64_t copy_engine_slot_pitch(std::int64_t message_bytes) { return (message_bytes + 255) / 256 * 256; }
// The tensor-parallel sums' receive slots per peer: sum k's copy waits until the peer has added
// sum k - 2 (its slot's previous message); the model starts one sum before each wait_all.
constexpr int kCopyEngineSumSlots = 2;
// Whether parallel.tp_transport asks for the copy engines (before the check that every rank
// reaches the others' memory): "copy_engine", or "auto" with micro-batch pairs (their sums run
// beside the other micro-batch's work; without them the forward's sums are in line, where the
// copies' latency loses to NCCL's kernels: docs/performance.md).
inline bool tp_sums_on_copy_engines(const std::string& transport, bool micro_batch_pairs) {
  return transport == "copy_engine" || (transport == "auto" && micro_batch_pairs);
}
inline std::int64_t copy_engine_link_bytes(std::int64_t message_bytes, int slots) {
  return slots * (copy_engine_slot_pitch(message_bytes) + 8);
}

}  // namespace nsatron::parallel
