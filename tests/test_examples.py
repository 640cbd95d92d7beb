"""Each example runs to completion, at reduced sizes (NTBRIDGE_EXAMPLE_QUICK=1), and writes only
into the directory given by ``--out``."""

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
    "kernel_distillation.py": "on 10 learned images",
    "training_dynamics.py": "infinite width: test accuracy",
    "unet.py": "infinite-width U-Net classifies",
    "bn_resnet.py": "BN-ResNet in eval mode, running statistics",
    "graph_network.py": "each example's own graph, forward(x, adjacency): test accuracy",
    "gp_fit.py": "learn=('weight_std', 'bias_std'): weight_std",
    "node_classification.py": "GCN trained (width 64, Adam): accuracy",
    "resnet_kernel.py": "ResNet-18 layout at infinite width",
}
WRITES = {"width_analysis.py": {"width_analysis.png", "width_analysis.csv"},  # into --out
          "kernel_distillation.py": {"kernel_distillation.png"}}
NEEDS_SKLEARN = {"kernel_regression.py", "kernel_distillation.py", "training_dynamics.py", "unet.py",
                 "bn_resnet.py", "node_classification.py", "resnet_kernel.py"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name, tmp_path):
    if name in NEEDS_SKLEARN:
        pytest.importorskip("sklearn", reason="the digits data set ships with scikit-learn")
    if name == "gp_fit.py":
        pytest.importorskip("botorch", reason="the example fits BoTorch's SingleTaskGP")
    if name == "node_classification.py":
        pytest.importorskip("torch_geometric", reason="the example's GCN is PyTorch Geometric's")
    env = {**os.environ, "NTBRIDGE_EXAMPLE_QUICK": "1", "PYTHONPATH": str(ROOT)}
    cwd, out_dir = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    args = ["--out", str(out_dir)] if name in WRITES else []
    out = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert EXPECTED[name] in out.stdout
    assert list(cwd.iterdir()) == []
    if name in WRITES:
        assert {p.name for p in out_dir.iterdir()} == WRITES[name]
        for png in (p for p in out_dir.iterdir() if p.suffix == ".png"):
            assert png.read_bytes()[:4] == b"\x89PNG"
    if name == "width_analysis.py":
        assert (out_dir / "width_analysis.csv").read_text().startswith("quantity,width,")
