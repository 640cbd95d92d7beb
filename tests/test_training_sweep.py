"""training_sweep: the distances to the linearization and to the infinite-width dynamics shrink
with the width, beyond the seeds' standard errors; its report."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

INPUTS = 16


def gaussian_mlp(width):
    """One hidden Tanh layer with Gaussian weights of torch's variances 1/(3 fan_in): the analytic
    kernel's assumption holds exactly (torch's uniform first layer, with few inputs, converges to a
    limit slightly off the Gaussian one; see docs/empirical.md, width analysis)."""
    model = nn.Sequential(nn.Linear(INPUTS, width), nn.Tanh(), nn.Linear(width, 1))
    with torch.no_grad():
        for layer in (model[0], model[2]):
            for p in layer.parameters():
                p.normal_(0, (3 * layer.in_features) ** -0.5)
    return model


@pytest.fixture(scope="module")
def sweep():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, INPUTS, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :1])
    x_test = torch.randn(5, INPUTS, generator=g, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.InitMismatchWarning)  # Gaussian, not uniform
        return ntbridge.analysis.training_sweep(gaussian_mlp, [32, 4096], x, y, x_test, steps=60,
                                                n_seeds=8)


@pytest.mark.slow
@pytest.mark.parametrize("quantity", ["linearized", "infinite"])
def test_the_gap_shrinks_with_the_width(sweep, quantity):
    mean, se = sweep.mean(quantity)[:, -1], sweep.standard_error(quantity)[:, -1]
    assert sweep.distances[quantity][:, :, 0].max() < 1e-12  # all start from the model's outputs
    assert mean[0] - mean[1] > 3 * np.hypot(*se)


def test_report(sweep, tmp_path):
    text = str(sweep)
    assert "model vs linearized:" in text and "model vs infinite width:" in text
    assert "step 60" in text and "mean ± standard error over 8 seeds" in text
    assert repr(sweep).startswith("TrainingSweep(widths=(32, 4096), steps=(0, 15, 30, 45, 60)")
    assert sweep.learning_rates[1] < sweep.learning_rates[0]  # half the limit: the NTK grows
    pytest.importorskip("matplotlib")
    sweep.plot(str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_arguments_are_refused():
    x = torch.randn(4, INPUTS, dtype=torch.float64)
    with pytest.raises(errors.InputError, match=r"y_train must be \(n, O\) with n = 4"):
        ntbridge.analysis.training_sweep(gaussian_mlp, [8], x, torch.zeros(4), x, steps=5)
    with pytest.raises(errors.InputError, match="steps must be >= 1"):
        ntbridge.analysis.training_sweep(gaussian_mlp, [8], x, torch.zeros(4, 1), x, steps=0)
