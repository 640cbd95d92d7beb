"""Each example runs to completion, at reduced sizes (NTBRIDGE_EXAMPLE_QUICK=1), prints what it
should and writes only into the directory given by ``--out``."""

import importlib.util
import json
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


# Every example in one Python process (each from its own working directory, with its own argv, as
# `python examples/NAME` runs it): the imports of torch, JAX and the optional libraries, which are
# most of a quick example's time, are paid once.
RUNNER = """
import contextlib, io, json, os, runpy, sys, traceback
examples, runs, report = json.loads(sys.argv[1])
sys.path.insert(0, examples)
results = {}
for name, cwd, args in runs:
    out, err = io.StringIO(), io.StringIO()
    os.chdir(cwd)
    sys.argv = [name, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(os.path.join(examples, name), run_name="__main__")
        ok = True
    except SystemExit as stop:
        ok = stop.code in (None, 0)
    except BaseException:
        err.write(traceback.format_exc())
        ok = False
    results[name] = {"ok": ok, "stdout": out.getvalue(), "stderr": err.getvalue()}
with open(report, "w") as f:
    json.dump(results, f)
"""


def _runnable(name: str) -> bool:
    """Whether the libraries ``name`` needs are installed (the dev extra has them all)."""
    needs = (["sklearn"] * (name in NEEDS_SKLEARN) + ["botorch"] * (name == "gp_fit.py")
             + ["torch_geometric"] * (name == "node_classification.py"))
    return all(importlib.util.find_spec(module) is not None for module in needs)


@pytest.mark.slow
def test_examples_run(tmp_path):
    names = [name for name in sorted(EXPECTED) if _runnable(name)]
    runs = []
    for name in names:
        cwd, out_dir = tmp_path / name / "cwd", tmp_path / name / "out"
        cwd.mkdir(parents=True)
        runs.append((name, str(cwd), ["--out", str(out_dir)] if name in WRITES else []))
    report = tmp_path / "report.json"
    env = {**os.environ, "NTBRIDGE_EXAMPLE_QUICK": "1", "PYTHONPATH": str(ROOT)}
    job = json.dumps([str(ROOT / "examples"), runs, str(report)])
    done = subprocess.run([sys.executable, "-c", RUNNER, job], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    results = json.loads(report.read_text())
    for name in names:
        result, out_dir = results[name], tmp_path / name / "out"
        assert result["ok"], f"{name}:\n{result['stderr']}"
        assert EXPECTED[name] in result["stdout"], name
        assert list((tmp_path / name / "cwd").iterdir()) == [], name
        if name in WRITES:
            assert {p.name for p in out_dir.iterdir()} == WRITES[name]
            for png in (p for p in out_dir.iterdir() if p.suffix == ".png"):
                assert png.read_bytes()[:4] == b"\x89PNG", name
        if name == "width_analysis.py":
            assert (out_dir / "width_analysis.csv").read_text().startswith("quantity,width,")
    if missing := sorted(set(EXPECTED) - set(names)):
        pytest.skip(f"the others ran; these need scikit-learn, BoTorch or PyG: {missing}")
