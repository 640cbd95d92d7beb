"""The bad-input catalogue (docs/bad-inputs.md): one test per row.

Each refused call raises the row's exception type (from ntbridge.errors) with its message, and
leaves nothing half-done: the model's weights, buffers and mode are unchanged, no file appears in
(or changes inside) the working directory, and the same call with good input still works.
"""

import functools
import os
import re

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors
from helpers import mlp

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "bad-inputs.md")

small_mlp = functools.partial(mlp, 4, [8], 2)  # 4 -> 8 -> 2, ReLU


X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


def with_value(x, index, value):
    x = x.clone()
    x[index] = value
    return x


class Branchy(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x) if x.sum() > 0 else -self.linear(x)


class Scaled(nn.Module):
    """No converter (a cumulative sum), and a parameter without reset_parameters."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return torch.cumsum(x * self.scale, dim=1)


IDS = torch.arange(12).reshape(3, 4) % 10


def tokens():
    return nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(16, 2))


def translated_tokens():
    """Token ids into a module without a converter: the model is translated (torch.export)."""
    return nn.Sequential(nn.Embedding(10, 4), Cumsum(), nn.Flatten(), nn.Linear(16, 2))


def misaligned(x):
    """``x``'s values in a tensor starting 4 bytes into its storage."""
    buf = torch.empty(x.numel() + 1)
    view = buf[1:].view(x.shape)
    view.copy_(x)
    return view


# Each row: id -> (model, call(model, tmp_path), exception type, message regex). The call gets
class Cumsum(nn.Module):
    """A functional call without an equivalent module, inside a nested module."""

    def forward(self, x):
        return torch.cumsum(x, 1)


# a fresh model; entry points named "all" are checked for every kernel function.
ENTRY_POINTS = {
    "ntk": lambda m, x1, x2=None, **kw: ntbridge.ntk(m, x1, x2, **kw),
    "nngp": lambda m, x1, x2=None, **kw: ntbridge.nngp(m, x1, x2, **kw),
    "kernel": lambda m, x1, x2=None, **kw: ntbridge.kernel(m, x1, x2, **kw),
    "empirical_ntk": lambda m, x1, x2=None, **kw: ntbridge.empirical_ntk(m, x1, x2, **kw),
    "empirical_nngp": lambda m, x1, x2=None, **kw: ntbridge.empirical_nngp(m, x1, x2, **kw),
    "monte_carlo": lambda m, x1, x2=None, **kw: ntbridge.monte_carlo(m, x1, x2, n_samples=2, **kw),
}

ROWS = {
    "unsupported-module": (lambda: nn.Sequential(nn.Linear(4, 8), nn.LSTMCell(8, 8)),
                           lambda m, p: ntbridge.ntk(m, X), errors.UnsupportedLayerError,
                           r"module 1 '1' \(LSTMCell\) has no infinite-width kernel rule.*register_converter"),
    "untraceable-model": (Branchy, lambda m, p: ntbridge.ntk(m, X),
                          errors.ConversionError, r"torch.fx could not trace Branchy.forward"),
    "unsupported-function": (lambda: nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.ReLU(), Cumsum())),
                             lambda m, p: ntbridge.ntk(m, X), errors.UnsupportedLayerError,
                             r"torch.cumsum in module '1.1' \(Cumsum\): call_function 'cumsum' has no "
                             r"equivalent module"),
    "unexportable-model": (Branchy, lambda m, p: ntbridge.empirical_ntk(m, X),
                           errors.ConversionError,
                           r"(?s)torch.export could not export Branchy.forward.*torch.cond"),
    "train-mode-translated": (lambda: nn.Sequential(nn.Embedding(10, 4), nn.Dropout(0.5)).train(),
                              lambda m, p: ntbridge.empirical_ntk(m, IDS),
                              errors.UnsupportedLayerError,
                              r"module '1' \(Dropout\) is in training mode.*model.eval\(\)"),
    "no-reset-parameters": (Scaled, lambda m, p: ntbridge.monte_carlo(m, X, n_samples=2),
                            errors.UnsupportedLayerError,
                            r"the model \(Scaled\) has parameters but no reset_parameters\(\)"),
    "init-of-translated-model": (translated_tokens,
                                 lambda m, p: ntbridge.monte_carlo(m, IDS, n_samples=2, W_std=1.0),
                                 errors.InputError, r"init, W_std and b_std choose the init of "
                                                    r"converted models"),
    "ids-and-floats": (tokens, lambda m, p: ntbridge.empirical_ntk(m, IDS, X), errors.InputTypeError,
                       r"x1 has dtype torch.int64 and x2 torch.float32"),
    "no-analytic-rule": (lambda: nn.Sequential(nn.Tanh(), nn.Linear(4, 8)),
                         lambda m, p: ntbridge.ntk(m, X), errors.UnsupportedLayerError,
                         r"module 0 '0' \(Tanh\).*needs a Gaussian input.*raw data"),
    "not-a-module": ("all", lambda f, m: f(lambda x: x, X), errors.InputTypeError,
                     r"model must be a torch.nn.Module, got function"),
    "not-a-tensor": ("all", lambda f, m: f(m, X.tolist()), errors.InputTypeError,
                     r"x1 must be a torch.Tensor, got list"),
    "integer-input": ("all", lambda f, m: f(m, X.long()), errors.InputTypeError,
                      r"x1 has dtype torch.int64.*x1.float\(\)"),
    "bool-input": ("all", lambda f, m: f(m, X, X > 0), errors.InputTypeError,
                   r"x2 has dtype torch.bool"),
    "complex-input": ("all", lambda f, m: f(m, X.to(torch.complex64)), errors.InputTypeError,
                      r"x1 is complex \(torch.complex64\); kernels take real inputs"),
    "nan-input": ("all", lambda f, m: f(m, with_value(X, (1, 2), float("nan"))), errors.InputError,
                  r"x1 contains NaN or Inf.*nan_to_num"),
    "inf-input": ("all", lambda f, m: f(m, X, with_value(X, (0, 0), -float("inf"))),
                  errors.InputError, r"x2 contains NaN or Inf"),
    "overflowing-input": ("all", lambda f, m: f(m, X * 1e20), errors.InputError,
                          r"kernel entries \[0:3, 0:3\] are not finite although the inputs are: "
                          r"a value overflowed float32.*float64"),
    "feature-mismatch": ("all", lambda f, m: f(m, X, torch.randn(2, 5)), errors.ShapeError,
                         r"x1 and x2 must have the same shape per example"),
    "unbatched-input": ("all", lambda f, m: f(m, X[0]), errors.ShapeError,
                        r"x1 has shape \(4,\).*x1\[None\]"),
    "input-does-not-fit": ("all", lambda f, m: f(m, torch.randn(3, 5)), errors.ShapeError,
                           r"x1 of shape \(3, 5\) does not fit the model: module 0 '0' \(Linear\)"),
    "empty-batch": ("all", lambda f, m: f(m, X[:0]), errors.InputError, r"x1 is an empty batch"),
    "zero-size-examples": ("all", lambda f, m: f(m, torch.randn(3, 0)), errors.ShapeError,
                           r"x1 has zero-size examples"),
    "zero-size-layer": (lambda: nn.Sequential(nn.Linear(4, 0), nn.ReLU(), nn.Linear(0, 1)),
                        lambda m, p: ntbridge.ntk(m, X), errors.InputError,
                        r"module 0 '0' \(Linear\) has a zero-size weight \(shape \(0, 4\)\)"),
    "input-on-other-device": ("all", lambda f, m: f(m, X.to("meta")), errors.InputError,
                              r"x1 is on meta, but JAX has no backend for it.*x1.cpu\(\)"),
    "x1-x2-on-different-devices": ("all", lambda f, m: f(m, X, X.to("meta")), errors.InputError,
                                   r"x1 is on cpu and x2 on meta"),
    "model-on-meta-device": ("all", lambda f, m: f(small_mlp().to("meta"), X), errors.InputError,
                             r"the model's 0.weight is on the meta device, which holds no data.*"
                             r"model.to_empty\(device='cpu'\)"),
    "model-dtype-mismatch": (lambda: small_mlp().double(), lambda m, p: ntbridge.empirical_ntk(m, X),
                             errors.InputTypeError, r"parameters are float64 but x1 is torch.float32"),
    "train-mode-dropout": (lambda: nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5)).train(),
                           lambda m, p: ntbridge.empirical_ntk(m, X), errors.UnsupportedLayerError,
                           r"Dropout in training mode is random; call model.eval\(\)"),
    "train-mode-dropout-tiled": (lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5),
                                                       nn.Linear(8, 1)).train(),
                                 lambda m, p: ntbridge.ntk(m, X, batch_size=2), errors.InputError,
                                 r"batch_size=2: this kernel of x1 with itself cannot be tiled"),
    "no-parameters": (lambda: nn.Sequential(nn.ReLU()), lambda m, p: ntbridge.empirical_ntk(m, X),
                      errors.InputError, r"no parameters.*empirical_nngp"),
    "trace-axes-out-of-range": (small_mlp, lambda m, p: ntbridge.empirical_ntk(m, X, trace_axes=(2,)),
                                errors.InputError, r"trace_axes=\(2,\) names an axis the output"),
    "trace-axes-not-a-sequence": (small_mlp, lambda m, p: ntbridge.empirical_ntk(m, X, trace_axes=1),
                                  errors.InputError, r"trace_axes must be a tuple of ints, got 1"),
    "trace-and-diagonal-overlap": (small_mlp, lambda m, p: ntbridge.empirical_ntk(
        m, X, trace_axes=(-1,), diagonal_axes=(1,)), errors.InputError, r"overlap"),
    "negative-batch-size": ("all", lambda f, m: f(m, X, batch_size=-1), errors.InputError,
                            r"batch_size must be >= 0"),
    "non-int-batch-size": ("all", lambda f, m: f(m, X, batch_size=2.0), errors.InputTypeError,
                           r"batch_size must be an int, got 2.0"),
    "too-many-devices": ("all", lambda f, m: f(m, X, device_count=99), errors.InputError,
                         r"device_count=99 but only \d+ local cpu devices exist"),
    "w-std-wrong-type": (small_mlp, lambda m, p: ntbridge.ntk(m, X, W_std="1.0"), errors.InputTypeError,
                         r"W_std must be a non-negative float"),
    "w-std-not-finite": (small_mlp, lambda m, p: ntbridge.ntk(m, X, b_std=float("nan")),
                         errors.InputError, r"b_std must be finite and non-negative.*got nan"),
    "w-std-unknown-module": (small_mlp, lambda m, p: ntbridge.ntk(m, X, W_std={"7": 1.0}),
                             errors.InputError, r"W_std names \['7'\].*valid names: \['0', '2'\]"),
    "unknown-option": (small_mlp, lambda m, p: ntbridge.ntk(m, X, parameterization="mean-field"),
                       errors.InputError, r"parameterization must be one of"),
    "unknown-implementation": (small_mlp, lambda m, p: ntbridge.empirical_ntk(m, X, implementation="fast"),
                               errors.InputError, r"implementation must be one of"),
    "out-not-npy": (small_mlp, lambda m, p: ntbridge.ntk(m, X, out=str(p / "k.txt")), errors.InputError,
                    r"out must be a path ending in .npy"),
    "out-missing-directory": (small_mlp, lambda m, p: ntbridge.ntk(m, X, out=str(p / "no" / "k.npy")),
                              errors.InputError, r"its directory does not exist"),
    "out-two-kernels": (small_mlp, lambda m, p: ntbridge.kernel(m, X, out=str(p / "k.npy")),
                        errors.InputError, r"out= stores one kernel"),
    "out-with-gradient": (small_mlp, lambda m, p: ntbridge.ntk(m, X.clone().requires_grad_(),
                                                         out=str(p / "k.npy")),
                          errors.InputError, r"out= writes the kernel to a file, which carries no "
                                             r"autograd history, but x1 or x2 requires grad"),
}

# Rows whose out file exists before the call: name -> how it is made.
OUT_FILES = {
    "out-corrupted": (lambda path: path.write_bytes(b"\x93NUMPY garbage"),
                      r"exists but has no tile record"),
    "out-foreign": (lambda path: np.save(path, np.zeros((3, 3), np.float32)),
                    r"exists but has no tile record"),
    "out-other-model": (lambda path: ntbridge.ntk(nn.Sequential(nn.Linear(4, 1)), X, out=str(path)),
                        r"written for a different model, input or options"),
}

COVERED_ELSEWHERE = {"cli-pickled-weights": "tests/test_cli.py"}


def snapshot(model, directory):
    """What a refused call must leave as it was: the model's tensors and modes, the files."""
    state = {} if not isinstance(model, nn.Module) else {
        k: v.clone() for k, v in model.state_dict().items() if v.device.type != "meta"}
    modes = [] if not isinstance(model, nn.Module) else [m.training for m in model.modules()]
    files = {f: (os.path.getsize(directory / f), (directory / f).read_bytes())
             for f in os.listdir(directory) if (directory / f).is_file()}
    return state, modes, files


def assert_unchanged(before, after):
    (s1, m1, f1), (s2, m2, f2) = before, after
    assert m1 == m2 and s1.keys() == s2.keys() and f1 == f2
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def cases():
    for name, (model, call, exc, message) in ROWS.items():
        if model == "all":
            for entry in ENTRY_POINTS:
                yield pytest.param(name, small_mlp, call, exc, message, entry, id=f"{name}-{entry}")
        else:
            yield pytest.param(name, model, call, exc, message, None, id=name)


@pytest.mark.slow
@pytest.mark.parametrize("name,make,call,exc,message,entry", list(cases()))
def test_row(name, make, call, exc, message, entry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = make()
    before = snapshot(model, tmp_path)
    with pytest.raises(exc, match=message) as info:
        if entry is None:
            call(model, tmp_path)
        else:
            call(ENTRY_POINTS[entry], model)
    assert isinstance(info.value, errors.NtbridgeError)
    assert_unchanged(before, snapshot(model, tmp_path))


# ntbridge.features and ntbridge.nystrom_features, called as f(model, x).
FEATURE_MAPS = {
    "features": lambda m, x: ntbridge.features(m, x, 8),
    "nystrom_features": lambda m, x: ntbridge.nystrom_features(m, x, x),  # x as landmarks
}


@pytest.mark.parametrize("name", ["not-a-tensor", "integer-input", "complex-input", "nan-input",
                                  "unbatched-input", "empty-batch", "zero-size-examples",
                                  "input-on-other-device", "model-on-meta-device"])
@pytest.mark.parametrize("entry", FEATURE_MAPS)
def test_feature_maps_refuse_as_the_kernels_do(entry, name, tmp_path):
    """The rows of one input, for the feature maps: the same refusal, naming their argument x."""
    _, call, exc, message = ROWS[name]
    model = small_mlp()
    before = snapshot(model, tmp_path)
    with pytest.raises(exc, match=message.replace("x1", "x")) as info:
        call(FEATURE_MAPS[entry], model)
    assert isinstance(info.value, errors.NtbridgeError)
    assert_unchanged(before, snapshot(model, tmp_path))


@pytest.mark.parametrize("entry", FEATURE_MAPS)
def test_feature_maps_take_half_precision_as_the_kernels_do(entry):
    """float16 inputs: computed and returned in float32, as by every kernel function."""
    x = X.half()
    phi = FEATURE_MAPS[entry](small_mlp(), x)
    assert phi.dtype == torch.float32 and ntbridge.ntk(small_mlp(), x).dtype == torch.float32
    torch.testing.assert_close(phi, FEATURE_MAPS[entry](small_mlp(), x.float()), rtol=0, atol=0)


def test_state_is_intact_after_refusals():
    """Refused calls leave no broken cache behind: the same model still computes."""
    model = small_mlp()
    for bad in (X.long(), with_value(X, (0, 0), float("nan")), X[:0]):
        with pytest.raises(errors.InputError):
            ntbridge.ntk(model, bad)
    k = ntbridge.ntk(model, X)
    assert torch.isfinite(k).all() and torch.equal(k, k.T)


@pytest.mark.parametrize("name", OUT_FILES)
def test_out_file_row(name, tmp_path):
    path = tmp_path / "k.npy"
    make, message = OUT_FILES[name]
    make(path)
    model = small_mlp()
    before = snapshot(model, tmp_path)
    with pytest.raises(errors.InputError, match=message):
        ntbridge.ntk(model, X, out=str(path))
    assert_unchanged(before, snapshot(model, tmp_path))  # file and record untouched, none added


@pytest.mark.parametrize("layout", ["non-contiguous", "misaligned"])
@pytest.mark.parametrize("entry", ["ntk", "empirical_ntk", "empirical_nngp"])
def test_unusual_layouts_work(layout, entry):
    """Rows non-contiguous-input and misaligned-input: accepted, same result as a plain tensor."""
    model = small_mlp()
    odd = X.T.contiguous().T if layout == "non-contiguous" else misaligned(X)
    assert odd.is_contiguous() == (layout == "misaligned") and torch.equal(odd, X)
    expected = ENTRY_POINTS[entry](model, X)
    torch.testing.assert_close(ENTRY_POINTS[entry](model, odd), expected, rtol=0, atol=0)
    torch.testing.assert_close(ENTRY_POINTS[entry](model, X, odd), expected, rtol=1e-6, atol=1e-7)


def test_catalogue_page_lists_exactly_the_tested_rows():
    with open(DOC) as f:
        listed = re.findall(r"^\| `([a-z0-9-]+)` \|", f.read(), flags=re.M)
    tested = {*ROWS, *OUT_FILES, *COVERED_ELSEWHERE, "non-contiguous-input", "misaligned-input"}
    assert len(listed) == len(set(listed)) >= 20
    assert set(listed) == tested


def test_numpy_floats_are_accepted_as_stds():
    """Any finite real number is a valid W_std/b_std (numpy scalars included)."""
    model = small_mlp()
    expected = ntbridge.ntk(model, X, W_std=1.5, b_std=0.1)
    got = ntbridge.ntk(model, X, W_std=np.float32(1.5), b_std={"0": np.float64(0.1), "2": 0.1})
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
