"""Each example runs to completion, at reduced sizes (NTBRIDGE_EXAMPLE_QUICK=1)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {
    "quickstart.py": "are close",
    "width_analysis.py": "Plot written to",
    "cnn_kernels.py": "head: global average pooling",
    "kernel_regression.py": "finite MLP",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name, tmp_path):
    if name == "kernel_regression.py":
        pytest.importorskip("sklearn", reason="the digits data set ships with scikit-learn")
    env = {**os.environ, "NTBRIDGE_EXAMPLE_QUICK": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / name)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert EXPECTED[name] in out.stdout
    if name == "width_analysis.py":
        assert (tmp_path / "width_analysis.png").read_bytes()[:4] == b"\x89PNG"
