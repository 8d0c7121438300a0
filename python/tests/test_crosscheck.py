# SPDX-License-Identifier: Apache-2.0
"""Python and C++ make the same decisions on the same calls: a recorded episode (seeded appends and attention)
replayed through memdecay's Python Sequence and through the C++ API (tests/driver/crosscheck_driver.cpp) gives
the same victims at every step and the same final digest, for every policy."""
import json
import os
import subprocess

import numpy as np
import pytest

import memdecay as md

DRIVER = os.environ.get("MEMDECAY_CROSSCHECK_DRIVER")
pytestmark = pytest.mark.skipif(not DRIVER, reason="the C++ driver is built by the project's CMake (CTest sets it)")

REGIONS = [0, 2, 3, 4, 5, 6, 1]


def record(seed, steps=30):
    """Each step's appends, and the attention each logical position would get at that step (float32 values, so
    both sides read the same numbers; a resident token's mass is looked up by its position)."""
    rng = np.random.default_rng(seed)
    logical, out = 0, []
    for i in range(steps):
        appends = [[REGIONS[i % len(REGIONS)], int(rng.integers(1, 40))]]
        logical += appends[0][1]
        m = (rng.random(logical, dtype=np.float32) ** 3 / np.float32(logical)).astype(np.float32)
        out.append({"append": appends, "mass_by_position": [float(x) for x in m]})
    return out


def run_python(policy, config, steps):
    cfg = md.Config(page_size=config["page_size"], alpha=config["alpha"], tau=config["tau"],
                    normalization=config["normalization"], budget=md.Budget.tokens(config["budget_tokens"]),
                    protection=md.Protection(recent_tokens=config["recent_tokens"]))
    seq = md.Sequence(cfg, policy=policy)
    victims = []
    for i, s in enumerate(steps):
        for region, count in s["append"]:
            seq.append(region, count)
        seq.advance_to(i + 1)
        by_position = np.array(s["mass_by_position"], dtype=np.float32)
        seq.observe_tokens(by_position[seq.positions()])
        plan = seq.select_for_budget()
        victims.append(plan.pages.tolist())
        if plan:
            seq.commit(plan)
    return victims, seq.digest()


@pytest.mark.parametrize("policy", md.POLICIES)
def test_python_and_cpp_decide_alike(policy, tmp_path):
    config = {"page_size": 8, "alpha": 1.0, "tau": 2.0, "normalization": "uniform", "budget_tokens": 160,
              "recent_tokens": 8}
    steps = record(seed=len(policy))
    path = tmp_path / "episode.json"
    path.write_text(json.dumps({"policy": policy, "config": config, "steps": steps}))
    cpp = json.loads(subprocess.check_output([DRIVER, str(path)]))
    victims, digest = run_python(policy, config, steps)
    assert sum(len(v) for v in victims) > 0, "the episode must evict"
    assert victims == cpp["victims"]
    assert digest == cpp["digest"]
