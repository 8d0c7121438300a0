#!/usr/bin/env python3
"""Every ```cpp block of README.md must appear verbatim in a file under examples/, which the build compiles."""
import pathlib
import re
import sys

readme, examples = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
blocks = re.findall(r"```cpp\n(.*?)```", readme.read_text(), flags=re.S)
if not blocks:
    sys.exit("README.md has no ```cpp blocks")
sources = [p.read_text() for p in sorted(examples.rglob("*.cpp"))]
missing = [b for b in blocks if not any(b in s for s in sources)]
for b in missing:
    print(f"README block not found verbatim in examples/:\n{b}", file=sys.stderr)
print(f"{len(blocks) - len(missing)} of {len(blocks)} README snippets are compiled examples")
sys.exit(1 if missing else 0)
