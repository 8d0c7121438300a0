# SPDX-License-Identifier: Apache-2.0
"""The tests import memdecay from the build tree (CTest sets PYTHONPATH to <build>/python)."""
import numpy as np
import pytest

import memdecay as md


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def attention(rng, n):
    """One attention row over n resident tokens (non-negative, sums to 1), float32."""
    a = rng.random(n, dtype=np.float32) ** 4
    return (a / a.sum()).astype(np.float32)


def episode(seq, rng, steps=40, chunk=24, budget_tokens=None):
    """Appends chunks of rotating regions, observes attention each step and evicts for the budget (state only).
    Returns every plan's pages, in order."""
    names = ["system", "user", "tool_in", "tool_out", "retrieval", "scratchpad", "plan"]
    victims = []
    for step in range(1, steps + 1):
        seq.append(names[step % len(names)] if step > 1 else "system", chunk)
        seq.advance_to(step)
        seq.observe_tokens(attention(rng, seq.kv_len))
        plan = seq.select_for_budget()
        victims.append(plan.pages.tolist())
        if plan:
            seq.commit(plan)
    return victims
