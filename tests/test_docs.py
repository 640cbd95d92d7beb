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
EXTRAS = {"gpytorch": "gpytorch", "botorch": "botorch", ".plot(": "matplotlib",
          "torch_geometric": "torch_geometric", "transformers": "transformers"}
# Blocks of more than 2 s (the first in a process pays for importing JAX), by their rank on the
# page (ids name the line, which moves whenever text above the block changes).
SLOW = {"README.md#1", "README.md#2", "transformers.md#1", "transformers.md#2", "transformers.md#4",
        "transformers.md#5", "transformers.md#6", "empirical.md#2", "dynamics.md#1", "gp.md#1",
        "graphs.md#2"}


def blocks():
    found = []
    for page in PAGES:
        text = page.read_text()
        matches = re.finditer(r"^( *)```python\n(.*?)^\1```", text, flags=re.S | re.M)
        for rank, match in enumerate(matches, start=1):
            line = text.count("\n", 0, match.start()) + 1
            marks = [pytest.mark.slow] if f"{page.name}#{rank}" in SLOW else []
            found.append(pytest.param(textwrap.dedent(match.group(2)), id=f"{page.name}:{line}",
                                      marks=marks))
    return found


BLOCKS = blocks()


def test_slow_marks_name_blocks():
    ranks = {f"{page.name}#{rank}" for page in PAGES
             for rank in range(1, page.read_text().count("```python") + 1)}
    assert SLOW <= ranks


@pytest.mark.parametrize("code", BLOCKS)
def test_block_runs(code, tmp_path, monkeypatch):
    for shown, module in EXTRAS.items():
        if shown in code and importlib.util.find_spec(module) is None:
            pytest.skip(f"needs the optional {module}")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(code, "<block>", "exec"), {"__name__": "__docs__"})
