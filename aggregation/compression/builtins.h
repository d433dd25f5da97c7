// Registration functions of the built-in compressors, one per source file (private header).
// add_builtin_compressors() in registry.cc calls them; users call only the public
// add_builtin_compressors().
#pragma once

#include "../registry_detail.h"
#include "cohort/aggregation/compressor.h"

namespace cohort::aggregation::detail {

void add_cast_compressors(CompressorRegistry& registry);  // none, fp16, bf16, int8
void add_qsgd_compressor(CompressorRegistry& registry);
void add_sparse_compressors(CompressorRegistry& registry);  // topk, randomk
void add_sign_compressor(CompressorRegistry& registry);
void add_powersgd_compressor(CompressorRegistry& registry);

}  // namespace cohort::aggregation::detail
