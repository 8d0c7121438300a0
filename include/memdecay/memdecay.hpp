// SPDX-License-Identifier: Apache-2.0
// memdecay: the umbrella header: the core an engine needs (the evictor, its policies, page tables, the manager,
// the exports). Tooling is included on its own: memdecay/trace.hpp, memdecay/trace_generator.hpp and the
// calibration headers (the memdecay::calibration target, which links nlohmann-json).
#ifndef MEMDECAY_MEMDECAY_HPP
#define MEMDECAY_MEMDECAY_HPP

#include "memdecay/version.hpp"
#include "memdecay/region.hpp"
#include "memdecay/config.hpp"
#include "memdecay/page_geometry.hpp"
#include "memdecay/retention_score.hpp"
#include "memdecay/sequence_state.hpp"
#include "memdecay/token_state.hpp"
#include "memdecay/attention.hpp"
#include "memdecay/ewma_tracker.hpp"
#include "memdecay/eviction.hpp"
#include "memdecay/page_table.hpp"
#include "memdecay/block_pool.hpp"
#include "memdecay/page_tables/flashinfer_csr.hpp"
#include "memdecay/page_tables/vllm_block_table.hpp"
#include "memdecay/page_tables/sglang_req_to_token.hpp"
#include "memdecay/simd/simd.hpp"
#include "memdecay/sequence.hpp"
#include "memdecay/policy.hpp"
#include "memdecay/policies/all.hpp"
#include "memdecay/manager.hpp"
#include "memdecay/exports/llama_cpp.hpp"
#include "memdecay/exports/tensorrt_llm.hpp"

#endif  // MEMDECAY_MEMDECAY_HPP
