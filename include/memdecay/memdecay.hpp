// SPDX-License-Identifier: Apache-2.0
// memdecay: the umbrella header: the core an engine needs (the evictor, its policies, page tables, the manager,
// the exports). Tooling is included on its own: memdecay/io/trace.hpp, memdecay/io/trace_generator.hpp and the
// calibration headers (the memdecay::calibration target, which links nlohmann-json).
#ifndef MEMDECAY_MEMDECAY_HPP
#define MEMDECAY_MEMDECAY_HPP

#include "memdecay/version.hpp"
#include "memdecay/core/region.hpp"
#include "memdecay/core/config.hpp"
#include "memdecay/core/page_geometry.hpp"
#include "memdecay/core/retention_score.hpp"
#include "memdecay/core/sequence_state.hpp"
#include "memdecay/core/token_state.hpp"
#include "memdecay/core/attention.hpp"
#include "memdecay/core/attention_rows.hpp"
#include "memdecay/core/ewma_tracker.hpp"
#include "memdecay/core/eviction.hpp"
#include "memdecay/page_tables/page_table.hpp"
#include "memdecay/page_tables/block_pool.hpp"
#include "memdecay/page_tables/flashinfer_csr.hpp"
#include "memdecay/page_tables/vllm_block_table.hpp"
#include "memdecay/page_tables/sglang_req_to_token.hpp"
#include "memdecay/simd/simd.hpp"
#include "memdecay/core/sequence.hpp"
#include "memdecay/core/policy.hpp"
#include "memdecay/policies/all.hpp"
#include "memdecay/core/manager.hpp"
#include "memdecay/core/executor.hpp"
#include "memdecay/digests/query_channels.hpp"
#include "memdecay/exports/llama_cpp.hpp"
#include "memdecay/exports/tensorrt_llm.hpp"

#endif  // MEMDECAY_MEMDECAY_HPP
