// Where activation checkpointing cuts a network into segments (CpuNetwork::set_recompute).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace cohort::kernels::cpu {

// A segment [a, b) of ops keeps op b-1's output (the next segment's input; the last segment's
// is the logits) and recomputes the rest into a scratch arena shared by all segments, so a
// training step holds the kept outputs plus the largest segment's arena (per sample): the
// outputs of its ops but the last, plus each op's extra floats (max-pool indices, dropout
// masks). For every arena size T that some segment needs, dynamic programming finds the
// segmentation with the fewest kept floats whose segments all fit T; the best T + kept wins, the
// larger T (fewer recomputed floats) on a tie.
//
// out_sizes, extra_sizes: per op, floats per sample. may_end[b] (b = 1..n): whether a segment
// may end after op b - 1; may_end[n] must hold. Returns the segment ends, ascending, the last n.
std::vector<std::size_t> plan_segment_ends(std::span<const std::size_t> out_sizes,
                                           std::span<const std::size_t> extra_sizes,
                                           const std::vector<bool>& may_end);

}  // namespace cohort::kernels::cpu
