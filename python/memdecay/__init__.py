# SPDX-License-Identifier: Apache-2.0
"""memdecay: region-aware KV-cache eviction for LLM inference engines (bindings of the C++ library).

    import memdecay as md
    seq = md.Sequence(md.Config(normalization="uniform", tau=2.0, budget=md.Budget.tokens(4096)))
    seq.append("system", 120); seq.append("user", 300)
    seq.advance_to(1); seq.observe_tokens(attention)      # float32 NumPy array or PyTorch CPU tensor, no copy
    plan = seq.select_for_budget()                        # phase 1: pure
    removal = seq.commit(plan, pool, request_id)          # phase 2: table and state together

Every policy runs in the one evictor: ``md.Sequence(cfg, policy="h2o", recent_fraction=0.5)``; ``md.POLICIES``
lists them. Errors are ``ConfigError`` / ``InputError`` (ValueError) and ``UsageError`` (RuntimeError), with the
C++ message; the state is unchanged after any of them. docs/python.md has the whole API.
"""
from ._memdecay import (  # noqa: F401
    POLICIES,
    BlockPool,
    Budget,
    Checkpoint,
    Config,
    ConfigError,
    FlashInferCsr,
    GlobalPlan,
    GlobalVictim,
    InputError,
    Manager,
    Normalization,
    PageExplanation,
    PageRemoval,
    Plan,
    Protection,
    Region,
    RegionOverride,
    RegionTable,
    Sequence,
    SglangReqToToken,
    UsageError,
    VllmBlockTable,
    __version__,
    apply_calibration,
    keep_largest_query_channels,
    llama_evicted_ranges,
    llama_position_ranges,
    regions,
    tensorrt_llm_retention,
    tensorrt_llm_retention_for_prompt,
)

__all__ = [name for name in dir() if not name.startswith("_")]
