"""Results and converted models print as short summaries; their values are one attribute away."""

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn

import ntbridge
from ntbridge.analysis import WidthSweep
from ntbridge.dlpack import describe
from ntbridge.empirical import StrategyInfo


def test_describe_names_shape_dtype_and_device():
    assert describe(torch.zeros(20, 5)) == "(20, 5) float32 cpu"
    assert describe(jax.device_put(jnp.zeros((2, 3)), jax.devices("cpu")[1])) == "(2, 3) float32 cpu:1"
    assert describe(np.zeros(4)) == "(4,) float64 host"


def test_kernels_repr_summarises_each_kernel():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    k = ntbridge.kernel(model, torch.randn(20, 16), torch.randn(5, 16))
    assert repr(k) == str(k) == "Kernels(nngp=(20, 5) float32 cpu, ntk=(20, 5) float32 cpu)"
    assert isinstance(k.ntk, torch.Tensor) and k.ntk.shape == (20, 5)
    only = ntbridge.kernel(model, torch.randn(3, 16, dtype=torch.float64), get=("ntk",))
    assert repr(only) == "Kernels(nngp=None, ntk=(3, 3) float64 cpu)"


def test_estimate_repr_gives_the_mean_standard_error():
    est = ntbridge.Estimate(torch.zeros(3, 4), torch.linspace(0.0, 1.0, 12).reshape(3, 4), 7)
    assert repr(est) == "Estimate(mean=(3, 4) float32 cpu, n_samples=7, mean standard error 0.5)"


def test_strategy_info_repr_leaves_the_costs_out():
    info = StrategyInfo("ntvp", {"ntvp": {"flops": 1.0, "bytes_accessed": 2.0, "estimated_s": 3.0}},
                        "requested")
    assert repr(info) == "StrategyInfo(implementation='ntvp', path='layers', reason='requested')"


def test_graph_repr_lists_the_layers_like_torch():
    graph = ntbridge.convert(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1, bias=False)))
    assert repr(graph) == (
        "Graph(\n"
        "  (0): Linear(in_features=3, out_features=8, bias=True) W_std=0.577 b_std=0.333\n"
        "  (1): ReLU()\n"
        "  (2): Linear(in_features=8, out_features=1, bias=False) W_std=0.577\n"
        ")")


def test_graph_repr_names_the_inputs_of_a_branching_layer():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden, self.out = nn.Linear(4, 4), nn.Linear(4, 1)

        def forward(self, x):
            return self.out(x + self.hidden(x))

    lines = repr(ntbridge.convert(Residual())).splitlines()
    assert lines[1].startswith("  (hidden): Linear(") and "<-" not in lines[1]
    assert lines[2].startswith("  (add): ") and lines[2].endswith(" <- input, hidden")
    assert lines[3].startswith("  (out): Linear(") and "<-" not in lines[3]


def test_width_sweep_repr_is_a_line_and_str_the_table():
    sweep = WidthSweep((64, 256), {"ntk": np.array([[0.2, 0.2], [0.1, 0.1]])}, "standard", "analytic")
    assert repr(sweep) == ("WidthSweep(widths=(64, 256), n_seeds=2, quantities=('ntk',), ntk slope "
                           "-0.500 ± 0.000, standard parameterization)")
    assert str(sweep).startswith("width |")
