// NSA branch 2, the choice of blocks (the attention over the chosen tokens is in attention.h).
//
// Selection block j covers tokens [j*l', (j+1)*l'-1]; query t lies in block b_t = t / l' and
// only blocks j <= b_t are eligible.
//
// Block score (paper Eq. 9): s[t,a,j] = sum_i (overlap(i,j)/d) * p_cmp[t,a,i], where
// overlap(i,j) counts the tokens shared by compressed block i ([i*d, i*d+l-1]) and selection
// block j. Because d | l and d | l', overlap/d is an integer (for 32/16/64 the blocks
// 4j-1..4j+3 weigh 1,2,2,2,1), and because l <= l' a compressed block touches at most two
// selection blocks. Group score: S[t,g,j] = sum over the group's heads a of s[t,a,j]; it is
// computed as sum_i (overlap(i,j)/d) * (sum_a p_cmp[t,a,i]), the same sum regrouped.
//
// Top-n: blocks 0, b_t and b_t-1 (when >= 0) are forced; the other places go to the eligible
// blocks with the largest S, ties to the smaller j; at most n blocks (fewer when fewer are
// eligible). The result is written ascending and padded with -1 to n entries.
//
// The choice is a constant for the backward pass; invert_selection() turns the per-query
// lists into per-block lists of queries for the key-side backward of the selected branch.
#pragma once
#include <cstdint>
#include <vector>

#include "nsa/nsa.h"

namespace nsatron::nsa::cpu {

// S[0..b_t] for one (b, t, g), from p_sum[i] = sum over the group's heads of p_cmp[t,a,i],
// i in [0, n_visible). Blocks with no visible compressed block get 0.
template <class Real>
void group_block_scores(const NsaDims& dims, const Real* p_sum, std::int64_t n_visible,
                        std::int64_t b_t, Real* S);

// The selection rule on scores S[0..b_t]; writes n = sel_count entries to `out` (ascending,
// -1 padded) and returns how many blocks were chosen. `scratch` holds >= b_t+1 ints.
template <class Real>
std::int64_t select_blocks(const Real* S, std::int64_t b_t, std::int64_t sel_count,
                           std::int32_t* out, std::int32_t* scratch);

// For every (b, g, block j): the queries t (ascending) whose selection contains j.
// queries[offsets[(b*G+g)*NB + j] .. offsets[(b*G+g)*NB + j + 1]) with NB = num_sel_blocks.
struct SelectionInverse {
  std::vector<std::int64_t> offsets;  // B*G*NB + 1
  std::vector<std::int32_t> queries;  // one entry per (b, t, g, selected block)
};
SelectionInverse invert_selection(const NsaDims& dims, const std::int32_t* sel_blocks);

}  // namespace nsatron::nsa::cpu
