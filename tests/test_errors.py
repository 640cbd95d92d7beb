"""Bad input: every error comes from ntbridge.errors, names its argument or module, says the fix."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

MODEL = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 2)))
X = torch.randn(3, 4)


@pytest.mark.parametrize("fn", [ntbridge.ntk, ntbridge.nngp, ntbridge.empirical_ntk])
def test_integer_inputs(fn):
    with pytest.raises(errors.InputTypeError, match=r"x1 has dtype torch.int64.*x1.float\(\)"):
        fn(MODEL, torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(errors.InputTypeError, match=r"x2 has dtype torch.bool"):
        fn(MODEL, X, torch.ones(3, 4, dtype=torch.bool))


def test_x1_x2_feature_mismatch():
    with pytest.raises(errors.ShapeError, match=r"x1 and x2 must have the same shape per example"):
        ntbridge.ntk(MODEL, X, torch.randn(2, 5))


def test_input_does_not_fit_first_layer():
    with pytest.raises(errors.ShapeError,
                       match=r"x1 of shape \(3, 5\) does not fit the model: module 0 '0' \(Linear\): "
                             r"expects inputs of shape \(N, \.\.\., 4\)"):
        ntbridge.ntk(MODEL, torch.randn(3, 5))


def test_input_does_not_fit_a_nested_layer():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(7, 2)))
    with pytest.raises(errors.ShapeError, match=r"module 2 '2.0' \(Linear\)"):
        ntbridge.empirical_ntk(model, X)


def test_empty_batch_and_unbatched():
    with pytest.raises(errors.InputError, match="x1 is an empty batch"):
        ntbridge.ntk(MODEL, torch.randn(0, 4))
    with pytest.raises(errors.ShapeError, match=r"x1\[None\]"):
        ntbridge.ntk(MODEL, torch.randn(4))


def test_unsupported_module_named_with_position_and_fix():
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.ReLU(), nn.LSTMCell(8, 8)))
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"^module 2 '1.1' \(LSTMCell\) has no infinite-width kernel rule in "
                             r"ntbridge\. Its empirical kernels work: ntbridge\.empirical_ntk.*"
                             r"register_converter\(LSTMCell\)\.$") as refused:
        ntbridge.ntk(model, X)
    message, supported = str(refused.value), refused.value.supported
    assert len(message) < 400 and "Linear" in supported and "Conv2d" in supported
    assert not {"Add", "Concat", "Scale", "_BatchNorm"} & set(supported + tuple(message.split()))


def test_relu_of_the_raw_data_has_no_gaussian_rule():
    model = nn.Sequential(nn.ReLU(), nn.Linear(4, 1))
    with pytest.raises(errors.UnsupportedLayerError, match=r"module 0 '0' \(ReLU\).*Gaussian"):
        ntbridge.ntk(model, X)


def test_bad_options():
    with pytest.raises(errors.InputError, match="parameterization must be one of"):
        ntbridge.ntk(MODEL, X, parameterization="mean-field")
    with pytest.raises(errors.InputError, match="init must be one of"):
        ntbridge.ntk(MODEL, X, init="xavier")
    with pytest.raises(errors.InputTypeError, match="W_std must be a non-negative float"):
        ntbridge.ntk(MODEL, X, W_std="1.0")
    with pytest.raises(errors.InputError, match=r"W_std names \['3'\].*valid names: \['0', '2.0'\]"):
        ntbridge.ntk(MODEL, X, W_std={"3": 1.0})
    with pytest.raises(errors.InputError, match="get must be"):
        ntbridge.kernel(MODEL, X, get="ntkk")
    with pytest.raises(errors.InputTypeError, match="model must be a torch.nn.Module"):
        ntbridge.ntk(lambda x: x, X)


def test_warnings_point_at_the_user_s_call(tmp_path, monkeypatch):
    """InitMismatchWarning and CacheWarning are reported at the line that called ntbridge, with
    the bound in words."""
    from ntbridge import programs

    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 1))
    nn.init.kaiming_normal_(model[0].weight)
    with pytest.warns(errors.InitMismatchWarning, match=r"largest \|entry\| .*, above the bound "
                                                          r"1/sqrt\(fan_in\) = 0\.5") as caught:
        ntbridge.ntk(model, X)
    assert caught[0].filename == __file__
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setattr(programs, "_WARNED", set())
    with pytest.warns(errors.CacheWarning) as caught:
        ntbridge.nngp(nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1)), X)
    assert caught[0].filename == __file__
