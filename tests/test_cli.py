"""The ``ntbridge`` command. Each subcommand and exit status is run once as a subprocess (the real
entry point); further cases of the same code path call ``main`` in-process, which is faster."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

MODELS = '''
from torch import nn

def mlp():
    return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 1))

def factory(width):
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1))

def not_a_model():
    return 3

def kaiming():
    model = mlp()
    nn.init.kaiming_normal_(model[0].weight)
    return model

def no_width():
    return mlp()
'''


def run(cwd, *args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "ntbridge.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_main(work, *args, monkeypatch):
    """``main(args)`` in ``work``, as the command would run there: returns its exit status."""
    from ntbridge.cli import main

    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    try:
        return main(list(args))
    except SystemExit as e:  # argparse: --help, usage errors
        return e.code


@pytest.fixture
def work(tmp_path):
    (tmp_path / "mymodels.py").write_text(MODELS)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x1.npy", x)
    np.save(tmp_path / "x2.npy", x[:3])
    return tmp_path


def test_every_subcommand_has_help(tmp_path, monkeypatch, capsys):
    out = run(tmp_path, "--help")
    assert out.returncode == 0 and "compare" in out.stdout
    for sub in ("demo", "kernel", "sweep", "compare"):
        assert run_main(tmp_path, sub, "--help", monkeypatch=monkeypatch) == 0
        text = capsys.readouterr().out
        assert f"usage: ntbridge {sub}" in text and "--json" in text
    assert run_main(tmp_path, "nonsense", monkeypatch=monkeypatch) == 2


@pytest.mark.slow
def test_demo_prints_the_sweep_and_writes_its_plot(tmp_path):
    out = run(tmp_path, "demo", "--widths", "32,128", "--seeds", "2")
    assert out.returncode == 0, out.stderr
    assert "Analytic NNGP (6, 6)" in out.stdout and "Analytic NTK" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.strip().startswith(("32 |", "128 |"))]
    assert len(rows) == 2
    assert "Plot written to ntbridge-demo-sweep.png" in out.stdout
    assert (tmp_path / "ntbridge-demo-sweep.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_kernel_analytic_and_empirical(work, monkeypatch):
    import ntbridge

    assert run_main(work, "kernel", "mymodels:mlp", "--x1", "x1.npy", "--x2", "x2.npy", "--out",
                    "k.npy", monkeypatch=monkeypatch) == 0
    x1, x2 = (torch.from_numpy(np.load(work / f)) for f in ("x1.npy", "x2.npy"))
    sys.path.insert(0, str(work))
    try:
        from mymodels import mlp
    finally:
        sys.path.remove(str(work))
    expected = ntbridge.ntk(mlp(), x1, x2)  # the analytic NTK does not depend on the weights
    np.testing.assert_allclose(np.load(work / "k.npy"), expected.numpy(), rtol=1e-6)

    # the empirical NTK of given weights, .pt inputs and output, JSON
    model = mlp()
    torch.save(model.state_dict(), work / "w.pt")
    torch.save(x1, work / "x1.pt")
    out = run(work, "kernel", "mymodels:mlp", "--x1", "x1.pt", "--get", "empirical",
              "--weights", "w.pt", "--out", "e.pt", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["shape"] == [5, 5] and info["get"] == "empirical"
    emp = torch.load(work / "e.pt", weights_only=True)
    torch.testing.assert_close(emp, ntbridge.empirical_ntk(model, x1), rtol=1e-5, atol=1e-6)


def test_kernel_bad_inputs_exit_2(work, monkeypatch, capsys):
    np.save(work / "wrong.npy", np.zeros((5, 7), np.float32))  # 7 features, the model takes 4
    cases = [("nomodule:mlp", "x1.npy", "cannot import module 'nomodule'"),
             ("mymodels:missing", "x1.npy", "no attribute"),
             ("mymodels:not_a_model", "x1.npy", "not a torch.nn.Module"),
             ("mymodels", "x1.npy", "package.module:callable"),
             ("mymodels:mlp", "absent.npy", "cannot read --x1"),
             ("mymodels:mlp", "wrong.npy", "x1")]
    for model, x, message in cases:
        assert run_main(work, "kernel", model, "--x1", x, "--out", "k.npy",
                        monkeypatch=monkeypatch) == 2, model
        assert message in capsys.readouterr().err, (model, x)


@pytest.mark.slow
def test_weights_with_a_pickled_object_are_refused(work, monkeypatch):
    marker = work / "unpickled"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    torch.save({"0.weight": Payload()}, work / "evil.pt")
    out = run(work, "kernel", "mymodels:mlp", "--x1", "x1.npy", "--out", "k.npy",
              "--get", "empirical", "--weights", "evil.pt")
    assert out.returncode == 2
    assert "never unpickles arbitrary objects" in out.stderr
    assert not marker.exists() and not (work / "k.npy").exists()
    # a pickled object as input is refused too, in .npy and in .pt
    np.save(work / "obj.npy", np.array([Payload()], dtype=object), allow_pickle=True)
    torch.save([Payload()], work / "obj.pt")
    for name in ("obj.npy", "obj.pt"):
        assert run_main(work, "kernel", "mymodels:mlp", "--x1", name, "--out", "k.npy",
                        monkeypatch=monkeypatch) == 2
    assert not marker.exists()


@pytest.mark.slow
def test_sweep_table_plot_csv_json(work, monkeypatch, capsys):
    out = run(work, "sweep", "mymodels:factory", "--widths", "16,64", "--x1", "x1.npy",
              "--seeds", "2", "--plot", "s.png", "--csv", "s.csv")
    assert out.returncode == 0, out.stderr
    assert "slope |" in out.stdout and "Plot written to s.png" in out.stdout
    assert (work / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert (work / "s.csv").read_text().startswith("quantity,width,mean")
    assert run_main(work, "sweep", "mymodels:factory", "--widths", "16,64", "--x1", "x1.npy",
                    "--seeds", "2", "--json", monkeypatch=monkeypatch) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["widths"] == [16, 64] and len(data["quantities"]["ntk"]["errors"][0]) == 2
    assert run_main(work, "sweep", "mymodels:factory", "--widths", "16,x", "--x1", "x1.npy",
                    monkeypatch=monkeypatch) == 2


def test_compare_exit_codes(work, monkeypatch, capsys):
    k = np.random.default_rng(1).standard_normal((4, 4))
    np.save(work / "a.npy", k)
    np.save(work / "close.npy", k * (1 + 1e-7))
    np.save(work / "far.npy", k + 1e-2)
    np.save(work / "other_shape.npy", k[:3])
    np.save(work / "text.npy", np.array([["a", "b"]]))
    out = run(work, "compare", "a.npy", "close.npy")
    assert out.returncode == 0 and "are close" in out.stdout
    out = run(work, "compare", "a.npy", "far.npy")
    assert out.returncode == 1 and "NOT close" in out.stdout and "worst entry" in out.stdout
    out = run(work, "compare", "a.npy", "other_shape.npy")
    assert out.returncode == 2 and "shape" in out.stderr
    main = lambda *args: run_main(work, "compare", *args, monkeypatch=monkeypatch)
    assert main("a.npy", "far.npy", "--atol", "0.1") == 0
    capsys.readouterr()
    assert main("a.npy", "far.npy", "--json") == 1
    assert json.loads(capsys.readouterr().out)["close"] is False
    (work / "junk.npy").write_text("not an array")
    for bad in ("text.npy", "missing.npy", "junk.npy"):
        assert main("a.npy", bad) == 2, bad
        assert "error:" in capsys.readouterr().err


def test_help_and_compare_import_neither_torch_nor_jax(tmp_path):
    """The command starts fast: --help (of the command and of a subcommand) and compare load
    neither torch nor JAX."""
    path = tmp_path / "a.npy"
    np.save(path, np.eye(3))
    code = (f"import sys\nfrom ntbridge import cli\n"
            f"for argv in (['--help'], ['kernel', '--help'], ['compare', {str(path)!r}, {str(path)!r}]):\n"
            f"    try:\n        cli.main(argv)\n    except SystemExit:\n        pass\n"
            f"print('loaded:', sorted(m for m in ('torch', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "loaded: []"


def test_outputs_and_factories_are_checked_before_any_work(work, monkeypatch, capsys):
    """A bad --out, --plot or --csv is refused (exit 2, one line) before the model is even
    imported: 'nomodule' would fail otherwise."""
    cases = [("kernel", "nomodule:mlp", "--x1", "x1.npy", "--out", "missing/dir/k.npy"),
             ("kernel", "nomodule:mlp", "--x1", "x1.npy", "--out", "k.txt"),
             ("sweep", "nomodule:factory", "--widths", "8,16", "--x1", "x1.npy", "--plot",
              "missing/p.png"),
             ("sweep", "nomodule:factory", "--widths", "8,16", "--x1", "x1.npy", "--csv", "s.txt"),
             ("demo", "--plot", "missing/demo.png")]
    messages = ["the directory 'missing/dir' does not exist", "write a .npy or .pt file",
                "the directory 'missing' does not exist", "--csv 's.txt': write a .csv file",
                "the directory 'missing' does not exist"]
    for args, message in zip(cases, messages):
        assert run_main(work, *args, monkeypatch=monkeypatch) == 2, args
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert run_main(work, "sweep", "mymodels:no_width", "--widths", "8,16", "--x1", "x1.npy",
                    monkeypatch=monkeypatch) == 2
    assert "must take the width" in capsys.readouterr().err


def test_kernel_options_weights_and_init(work, monkeypatch, capsys):
    import ntbridge

    sys.path.insert(0, str(work))
    try:
        from mymodels import kaiming, mlp
    finally:
        sys.path.remove(str(work))
    x1 = torch.from_numpy(np.load(work / "x1.npy"))
    model = kaiming()
    torch.save(model.state_dict(), work / "w.pt")
    kernel = lambda *extra: run_main(work, "kernel", "mymodels:mlp", "--x1", "x1.npy", "--out",
                                     "k.npy", *extra, monkeypatch=monkeypatch)
    assert kernel("--weights", "w.pt") == 2  # the analytic kernel would ignore them
    assert "Add --init infer, or drop --weights" in capsys.readouterr().err
    assert kernel("--weights", "w.pt", "--init", "infer", "--batch-size", "2") == 0
    expected = ntbridge.ntk(model, x1, init="infer")
    np.testing.assert_allclose(np.load(work / "k.npy"), expected.numpy(), rtol=1e-6)
    assert kernel("--W-std", "1.5", "--b-std", "0.1") == 0
    np.testing.assert_allclose(np.load(work / "k.npy"),
                               ntbridge.ntk(mlp(), x1, W_std=1.5, b_std=0.1).numpy(), rtol=1e-6)
    assert kernel("--get", "empirical", "--W-std", "1.5") == 2
    assert "--W-std choose the init the analytic kernels assume" in capsys.readouterr().err
    # weights a factory initialised otherwise: the warning advises the command's own options
    assert run_main(work, "kernel", "mymodels:kaiming", "--x1", "x1.npy", "--out", "k.npy",
                    monkeypatch=monkeypatch) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "--init infer" in err and "init='infer'" not in err


def test_input_files_are_explained_in_the_command_s_terms(work, monkeypatch, capsys):
    (work / "text.npy").write_text("1 2 3\n4 5 6\n")
    np.save(work / "complex.npy", np.ones((3, 4), np.complex64))
    np.save(work / "one.npy", np.ones(4, np.float32))
    np.save(work / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    messages = {"text.npy": "is not a .npy file (it has no numpy header)",
                "complex.npy": "holds complex numbers (dtype complex64)",
                "one.npy": "save a single example with shape (1, 4)",
                "objects.npy": "holds Python objects (an object array)"}
    for name, message in messages.items():
        assert run_main(work, "kernel", "mymodels:mlp", "--x1", name, "--out", "k.npy",
                        monkeypatch=monkeypatch) == 2
        err = capsys.readouterr().err
        assert message in err and "x1[None]" not in err, (name, err)


def test_negative_or_nan_tolerances_exit_2(work, monkeypatch, capsys):
    np.save(work / "k.npy", np.eye(3))
    for option, value in (("--rtol", "-1"), ("--atol", "-1e-3"), ("--rtol", "nan")):
        assert run_main(work, "compare", "k.npy", "k.npy", f"{option}={value}",
                        monkeypatch=monkeypatch) == 2, (option, value)
        err = capsys.readouterr().err
        assert f"{option} must be a non-negative number" in err and "NOT close" not in err


def test_times_count_from_the_process_start():
    """The times the command prints include the interpreter's start-up and every import: a
    process that slept before importing the command reports at least that long."""
    code = ("import time\ntime.sleep(0.5)\nfrom ntbridge.cli.commands import since_start\n"
            "print(since_start())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert 0.5 <= float(out.stdout) < 30

