# SPDX-License-Identifier: Apache-2.0
"""Every python block of docs/python.md runs, in order, on a small engine set up here."""
import os
import re

import numpy as np

import memdecay as md

DOC = os.path.join(os.environ.get("MEMDECAY_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                   "docs", "python.md")


def test_the_python_guide_runs():
    text = open(DOC).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    request_id, child_id = 42, 43
    pool = md.BlockPool(1024, 16)
    pool.open(request_id)
    pool.append_tokens(request_id, 780)
    namespace = {
        "mass": np.full(780, 1.0 / 780, dtype=np.float32),
        "pool": pool,
        "request_id": request_id,
        "child_id": child_id,
        "drafts": 4,
        "step": 2,
    }
    for block in blocks:
        exec(compile(block, DOC, "exec"), namespace)
    assert isinstance(namespace["removal"], md.PageRemoval)
    assert isinstance(namespace["removals"], dict)
