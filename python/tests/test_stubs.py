# SPDX-License-Identifier: Apache-2.0
"""The type stubs name every public member of the extension (so editors complete what exists)."""
import ast
import os

import memdecay as md
from memdecay import _memdecay

STUB = os.path.join(os.path.dirname(_memdecay.__file__), "_memdecay.pyi")


def stub_names():
    tree = ast.parse(open(STUB).read())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            top.add(node.name)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {
                n.name if isinstance(n, ast.FunctionDef) else n.target.id
                for n in node.body
                if isinstance(n, ast.FunctionDef) or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
            }
        if isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
    return top, members


def test_every_public_name_has_a_stub():
    top, members = stub_names()
    public = {n for n in dir(_memdecay) if not n.startswith("_")}
    assert public - top == set(), "names without a stub"
    for cls in ("Sequence", "Manager", "Config", "BlockPool", "VllmBlockTable", "SglangReqToToken", "FlashInferCsr",
                "Plan", "GlobalPlan", "PageRemoval"):
        real = {n for n in dir(getattr(md, cls)) if not n.startswith("_")}
        assert real - members[cls] == set(), f"{cls}: members without a stub"
