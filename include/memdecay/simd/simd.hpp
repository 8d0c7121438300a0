// SPDX-License-Identifier: Apache-2.0
// memdecay: the SIMD layer (architecture selection, packets, exp, the scorer, fast selection).
#ifndef MEMDECAY_SIMD_SIMD_HPP
#define MEMDECAY_SIMD_SIMD_HPP

#include "memdecay/simd/arch.hpp"
#include "memdecay/simd/packet.hpp"
#include "memdecay/simd/exp.hpp"
#include "memdecay/simd/mass_check.hpp"
#include "memdecay/simd/score_kernel.hpp"
#include "memdecay/simd/expfree.hpp"
#include "memdecay/simd/select.hpp"
#include "memdecay/simd/recall_select.hpp"

#endif  // MEMDECAY_SIMD_SIMD_HPP
