# SPDX-License-Identifier: Apache-2.0
"""The PyTorch example (python/examples/paged_eviction.py) recalls what memdecay-eval recalls: the same episodes,
policies and budget give the same recalled probes per region, with the bundled small model decoding in PyTorch
and memdecay evicting from Python, as memdecay-eval's C++ engine and C++ API do."""
import importlib.util
import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="the example needs PyTorch (Debian: python3-torch; tools/bootstrap)")

ROOT = os.environ.get("MEMDECAY_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
EVAL = os.environ.get("MEMDECAY_EVAL", "")
EPISODES = os.path.join(ROOT, "models", "episodes-need-450.json")
N_EPISODES = 4
POLICIES = ["memdecay-none", "memdecay-zscore", "h2o", "tova"]


def load_example():
    spec = importlib.util.spec_from_file_location("paged_eviction",
                                                  os.path.join(ROOT, "python", "examples", "paged_eviction.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def eval_results(tmp_path_factory):
    if not os.path.exists(EVAL):
        pytest.skip(f"memdecay-eval is not built (MEMDECAY_EVAL={EVAL!r})")
    out = tmp_path_factory.mktemp("eval") / "eval.json"
    subprocess.run([EVAL, "--models", "small", "--episodes-file", EPISODES, "--episodes", str(N_EPISODES),
                    "--budgets", "0.25", "--page-sizes", "16", "--policies", ",".join(POLICIES), "--json", str(out)],
                   check=True, capture_output=True)
    rows = json.load(open(out))["results"]
    return {r["policy"]: {k: v["recalled"] for k, v in r["regions"].items()} for r in rows if r["budget"] == 0.25}


@pytest.mark.parametrize("policy", POLICIES)
def test_the_example_recalls_what_memdecay_eval_recalls(policy, eval_results):
    ex = load_example()
    torch.set_num_threads(1)
    model, _, _ = ex.M.load_model(os.path.join(ROOT, "models", "small", "model.safetensors"))
    data = json.load(open(EPISODES))
    recalled = {r: 0 for r in ex.REGIONS}
    evicted = 0
    for ep in data["episodes"][:N_EPISODES]:
        got, pages = ex.run_episode(model, ep, data["vocab_layout"]["query"], policy, 0.25)
        evicted += pages
        for p, ok in zip(ep["probes"], got):
            recalled[p["region"]] += ok
    assert evicted > 0
    want = {r: eval_results[policy].get(r, 0) for r in ex.REGIONS}
    assert recalled == want
    assert sum(want.values()) < sum(len(ep["probes"]) for ep in data["episodes"][:N_EPISODES])  # eviction cost something
