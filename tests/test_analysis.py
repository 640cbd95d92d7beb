import csv
import io
import math
import sys

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge.analysis import Fit, WidthSweep, analytic_ntk_by_layer, width_sweep
from ntbridge.errors import InputError

D_IN = 64
X = torch.randn(8, D_IN, generator=torch.Generator().manual_seed(1))


def one_hidden(width):
    return nn.Sequential(nn.Linear(D_IN, width), nn.ReLU(), nn.Linear(width, 1))


@pytest.fixture(scope="module")
def sweep():
    return width_sweep(one_hidden, [64, 256, 1024, 4096], X, n_seeds=4, implementation="structured")


@pytest.mark.slow
def test_slope_is_about_minus_one_half(sweep):
    # With one hidden layer, the empirical NTK and the readout-conditional NNGP are means of
    # `width` i.i.d. terms, so their RMS error is exactly proportional to width**-0.5. The band
    # -0.5 ± 0.2 is at least 4 standard errors of the fitted slope (se from the seeds, checked
    # below) plus room for the small flattening from torch's uniform first layer (non-Gaussian
    # pre-activations at d_in = 64 bias the limit by O(1/d_in)).
    for quantity in ("ntk", "nngp"):
        fit = sweep.fit(quantity)
        assert fit.standard_error < 0.05, fit
        assert -0.7 < fit.slope < -0.3, (quantity, fit)
    assert sweep.slope == sweep.fit("ntk").slope


def test_per_layer_quantities_and_shapes(sweep):
    assert sweep.layer_reference == "analytic"
    assert list(sweep.errors) == ["ntk", "nngp", "ntk[0]", "ntk[2]"]
    for e in sweep.errors.values():
        assert e.shape == (4, 4) and np.all(e > 0)
    # the readout's NTK contribution is h.h + 1 = (3 fan_in) * (readout-conditional NNGP), so the
    # two relative errors coincide: an exact identity up to float32 rounding
    np.testing.assert_allclose(sweep.errors["ntk[2]"], sweep.errors["nngp"], rtol=1e-4)


def test_analytic_contributions_sum_to_the_ntk():
    model = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    x1, x2 = torch.randn(6, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    for x2_ in (x2, None):
        parts = analytic_ntk_by_layer(model, x1, x2_)
        assert list(parts) == ["0", "2", "4"]
        total = ntbridge.ntk(model, x1, x2_)
        torch.testing.assert_close(sum(parts.values()), total, rtol=1e-12, atol=0)


def test_table_markdown_csv(sweep, tmp_path):
    text = str(sweep)
    assert text.splitlines()[0].split("|")[0].strip() == "width"
    assert "4096 |" in text and "slope |" in text and "NTK layer '0'" in text
    md = sweep.to_markdown()
    assert md.startswith("| width | NTK | NNGP |") and "| slope |" in md
    path = tmp_path / "sweep.csv"
    text = sweep.to_csv(str(path))
    assert path.read_text() == text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 4 * 4  # 4 quantities x 4 widths
    ntk_rows = [r for r in rows if r["quantity"] == "ntk"]
    np.testing.assert_allclose([float(r["mean"]) for r in ntk_rows], sweep.mean("ntk"))
    assert float(ntk_rows[0]["slope"]) == pytest.approx(sweep.slope)
    assert sweep.to_dict()["quantities"]["ntk"]["errors"] == sweep.errors["ntk"].tolist()


def test_plot_writes_a_png(sweep, tmp_path):
    path = sweep.plot(str(tmp_path / "sweep.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_extra(sweep, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'ntbridge\[plot\]'"):
        sweep.plot(str(tmp_path / "x.png"))


def test_residual_model_reports_seed_spread():
    class Residual(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.inp, self.hidden, self.out = nn.Linear(4, width), nn.Linear(width, width), nn.Linear(width, 1)

        def forward(self, x):
            z = self.inp(x)
            return self.out(torch.relu(z + self.hidden(torch.relu(z))))

    result = width_sweep(Residual, [8, 16], torch.randn(3, 4), n_seeds=2, implementation="jacobian")
    assert result.layer_reference == "seed spread"
    assert set(result.errors) == {"ntk", "nngp", "ntk[inp]", "ntk[hidden]", "ntk[out]"}
    assert "vs its mean over seeds" in str(result)


def test_ntk_parameterization_rescales_each_layer():
    x = torch.randn(4, 8)
    standard = width_sweep(one_hidden_small, [32], x, n_seeds=1)
    ntk = width_sweep(one_hidden_small, [32], x, n_seeds=1, parameterization="ntk")
    # per-layer relative errors are scale-free, so they agree; the total differs (other weights)
    np.testing.assert_allclose(ntk.errors["ntk[0]"], standard.errors["ntk[0]"], rtol=1e-4)
    np.testing.assert_allclose(ntk.errors["nngp"], standard.errors["nngp"], rtol=1e-6)
    assert not np.allclose(ntk.errors["ntk"], standard.errors["ntk"], rtol=1e-3)


def one_hidden_small(width):
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 1))


def test_bad_arguments():
    with pytest.raises(InputError, match="widths"):
        width_sweep(one_hidden_small, [], torch.randn(3, 8), n_seeds=1)
    with pytest.raises(InputError, match="n_seeds"):
        width_sweep(one_hidden_small, [8], torch.randn(3, 8), n_seeds=0)
    with pytest.raises(InputError, match="final nn.Linear"):
        width_sweep(lambda w: nn.Sequential(nn.Linear(8, w), nn.ReLU()), [8], torch.randn(3, 8),
                    n_seeds=1)
    with pytest.raises(ntbridge.errors.InputTypeError, match="nn.Module"):
        width_sweep(lambda w: "model", [8], torch.randn(3, 8), n_seeds=1)
    with pytest.raises(InputError, match=r"kernel has shape \(3, 3, 5\).*pool them"):
        width_sweep(one_hidden_small, [8], torch.randn(3, 5, 8), n_seeds=1)  # per token


def sweep_of(errors: dict, widths: tuple = (64, 256)) -> WidthSweep:
    return WidthSweep(widths, {q: np.array(e) for q, e in errors.items()}, "standard", "analytic")


def test_a_slope_too_uncertain_to_tell_from_minus_one_half_is_said_in_words():
    # NTK: mean 0.10 then 0.12 (slope +0.13) over seeds spread from 0.02 to 0.22 (standard error
    # about 0.9); NNGP: -0.5 exactly, with a small spread
    sweep = sweep_of({"ntk": [[0.02, 0.18], [0.02, 0.22]], "nngp": [[0.19, 0.21], [0.095, 0.105]]})
    ntk, nngp = sweep.fit("ntk"), sweep.fit("nngp")
    assert ntk.slope > 0 and ntk.standard_error > 0.6 and ntk.uncertain and not nngp.uncertain
    words = (f"Slopes too uncertain to tell from -0.5 (or from 0, no convergence): NTK {ntk}; use "
             f"more seeds or wider widths.")
    assert str(ntk) == f"{ntk.slope:+.3f} ± {ntk.standard_error:.3f}"
    assert str(sweep).endswith("\n" + words)
    assert words in sweep.to_markdown() and "NNGP" not in words


def test_a_slope_told_apart_from_zero_has_no_caveat():
    # -0.53 ± 0.04 is within its error of -0.5 but far from 0; -0.3 ± 0.01 is far from both
    assert not Fit(-0.53, 0.04, 0.0).uncertain and not Fit(-0.3, 0.01, 0.0).uncertain
    assert Fit(-0.3, 0.35, 0.0).uncertain and Fit(-0.5, math.nan, 0.0).uncertain
    assert not Fit(math.nan, math.nan, math.nan).uncertain  # one width: no slope to speak of
    precise = sweep_of({"ntk": [[0.19, 0.21], [0.095, 0.105]]})
    assert "too uncertain" not in str(precise)


def test_one_seed_or_one_width_says_why_a_figure_is_missing():
    def slope_row(text):
        return next(line for line in text.splitlines() if line.startswith("slope"))

    one_seed = str(sweep_of({"ntk": [[0.2], [0.1]]}))
    assert "nan" not in one_seed and "±" not in one_seed.splitlines()[2]  # no spread to show
    assert slope_row(one_seed).endswith("-0.500")  # the slope, without a standard error
    assert one_seed.endswith("\nOne seed: no spread per width and no standard error of the slopes; "
                             "use n_seeds >= 2.")
    one_width = str(sweep_of({"ntk": [[0.2, 0.3]]}, widths=(64,)))
    assert "nan" not in one_width and slope_row(one_width).endswith("n/a")
    assert one_width.endswith("\nNo slope: a slope needs at least two distinct widths.")
