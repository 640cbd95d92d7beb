"""Every python block of README.md and docs/*.md runs as written: each in a fresh namespace, from
a fixed torch seed, in a directory of its own (blocks may write files). Blocks that use an optional
extra are skipped only where that extra is missing."""

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# What a block's text shows -> the module it then needs (an optional extra).
EXTRAS = {"gpytorch": "gpytorch", "botorch": "botorch", ".plot(": "matplotlib"}
# Blocks of more than 2 s (the first in a process pays for importing JAX).
SLOW = {"README.md:8", "README.md:45", "transformers.md:42", "empirical.md:98", "dynamics.md:18",
        "gp.md:18"}


def blocks():
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^( *)```python\n(.*?)^\1```", text, flags=re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            name = f"{page.name}:{line}"
            marks = [pytest.mark.slow] if name in SLOW else []
            found.append(pytest.param(textwrap.dedent(match.group(2)), id=name, marks=marks))
    return found


BLOCKS = blocks()


def test_slow_marks_name_blocks():
    assert SLOW <= {block.id for block in BLOCKS}


@pytest.mark.parametrize("code", BLOCKS)
def test_block_runs(code, tmp_path, monkeypatch):
    for shown, module in EXTRAS.items():
        if shown in code and importlib.util.find_spec(module) is None:
            pytest.skip(f"needs the optional {module}")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(code, "<block>", "exec"), {"__name__": "__docs__"})
