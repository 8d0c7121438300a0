// SPDX-License-Identifier: Apache-2.0
// memdecay: every shipped eviction policy (docs/policies.md compares them).
#ifndef MEMDECAY_POLICIES_ALL_HPP
#define MEMDECAY_POLICIES_ALL_HPP

#include "memdecay/policies/h2o.hpp"
#include "memdecay/policies/memdecay.hpp"
#include "memdecay/policies/norm_sum.hpp"
#include "memdecay/policies/priority_lru.hpp"
#include "memdecay/policies/random.hpp"
#include "memdecay/policies/scissorhands.hpp"
#include "memdecay/policies/snapkv.hpp"
#include "memdecay/policies/streaming_llm.hpp"
#include "memdecay/policies/tova.hpp"

#endif  // MEMDECAY_POLICIES_ALL_HPP
