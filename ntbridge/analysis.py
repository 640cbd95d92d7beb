"""Width analysis: how far finite torch networks are from their infinite-width kernels.

:func:`width_sweep` builds fresh models of growing width and measures, for each width and seed, the
relative Frobenius error ``||K_emp - K||_F / ||K||_F`` of three finite-width kernels against their
analytic limits (``ntbridge.ntk``/``ntbridge.nngp`` of the same model):

* ``"ntk"``: the empirical NTK of the model (``ntbridge.empirical_ntk``).
* ``"nngp"``: the output covariance of the network *conditional on its last hidden layer*, i.e. the
  exact expectation over the readout layer's weights and bias,
  ``W_std**2 h(x1) . h(x2) / fan_in + b_std**2`` with ``h`` the readout's inputs. A single network's
  ``f(x1) f(x2)`` does not converge as the width grows (it is one draw of a Gaussian process); its
  expectation over the readout does, at the same ``width**-1/2`` rate as the NTK.
* ``"ntk[NAME]"``: the NTK contribution of the parameters of module ``NAME`` (``by_layer``) against
  the analytic NTK's contribution of that module. The analytic NTK is linear in the NTK entering
  each layer, so the contribution of modules ``j, j+1, ...`` is the NTK computed with the incoming
  NTK zeroed at module ``j``; a module's own contribution is the difference of two such suffixes.
  This needs a chain of modules (an ``nn.Sequential``); for other graphs (residual sums,
  concatenations) each module's error is instead its empirical contribution's relative deviation
  from the mean over seeds (``layer_reference == "seed spread"``), which also falls as
  ``width**-1/2`` but is not a distance to the limit.

The fitted slope of ``log(mean error)`` against ``log(width)`` is about ``-0.5``.

Example:
    >>> build = lambda w: nn.Sequential(nn.Linear(8, w), nn.ReLU(), nn.Linear(w, 1))
    >>> sweep = ntbridge.analysis.width_sweep(build, [64, 256, 1024], torch.randn(6, 8), n_seeds=3)
    >>> print(sweep)                 # a table: mean ± std over seeds, and the fitted slopes
    >>> sweep.slope                  # about -0.5
    >>> sweep.plot("sweep.png")      # needs matplotlib: pip install 'ntbridge[plot]'
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from typing import Callable, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np
import torch
from torch import nn

from .api import empirical_ntk
from .converters import Graph
from .devices import platform_of
from .empirical.reinit import sample_seed
from .errors import InputError, InputTypeError
from .pipeline import Request, run
from .stax import input_kernel
from .tiling import Task

SEED_SPREAD = "seed spread"


class Fit(NamedTuple):
    """``log(error) ~ slope * log(width) + intercept``; ``standard_error`` of the slope comes from
    the spread over seeds (delta method, NaN with one seed); NaN slope with fewer than 2 widths."""

    slope: float
    standard_error: float
    intercept: float

    @property
    def uncertain(self) -> bool:
        """Whether the sweep cannot tell the expected slope -0.5 from no convergence (0): the
        standard error is larger than the slope's distance from both, or unknown (one seed).

        Example:
            >>> Fit(0.12, 0.8, 0.0).uncertain, Fit(-0.53, 0.04, 0.0).uncertain
            (True, False)
        """
        distance = max(abs(self.slope + 0.5), abs(self.slope))
        return not math.isnan(self.slope) and not self.standard_error <= distance

    def __str__(self) -> str:
        """``slope ± standard error``, e.g. ``-0.487 ± 0.021``."""
        return f"{self.slope:+.3f} ± {self.standard_error:.3f}"


@dataclasses.dataclass(frozen=True)
class WidthSweep:
    """The result of :func:`width_sweep`.

    Attributes:
      widths: the widths, in the order given.
      errors: quantity (``"ntk"``, ``"nngp"``, ``"ntk[NAME]"``) -> relative errors, an array
        ``(len(widths), n_seeds)``.
      parameterization: of the NTK compared (``"standard"`` or ``"ntk"``).
      layer_reference: ``"analytic"`` or ``"seed spread"`` (see the module doc).
    """

    widths: tuple[int, ...]
    errors: dict[str, np.ndarray]
    parameterization: str
    layer_reference: str

    def __repr__(self) -> str:
        """A line; ``print(sweep)`` gives the table, ``sweep.errors`` the values."""
        return (f"WidthSweep(widths={self.widths}, n_seeds={self.n_seeds}, "
                f"quantities={tuple(self.errors)}, ntk slope {self.fit('ntk')}, "
                f"{self.parameterization} parameterization)")

    @property
    def n_seeds(self) -> int:
        return next(iter(self.errors.values())).shape[1]

    def mean(self, quantity: str = "ntk") -> np.ndarray:
        """Mean error over seeds, per width."""
        return self.errors[quantity].mean(axis=1)

    def spread(self, quantity: str = "ntk") -> np.ndarray:
        """Standard deviation of the error over seeds, per width (0 with one seed)."""
        e = self.errors[quantity]
        return e.std(axis=1, ddof=1) if e.shape[1] > 1 else np.zeros(e.shape[0])

    def fit(self, quantity: str = "ntk") -> Fit:
        """Least-squares fit of ``log(mean error)`` against ``log(width)``."""
        u, mean = np.log(np.asarray(self.widths, float)), self.mean(quantity)
        if len(set(self.widths)) < 2 or np.any(mean <= 0):
            return Fit(math.nan, math.nan, math.nan)
        c = (u - u.mean()) / np.sum((u - u.mean()) ** 2)
        y = np.log(mean)
        slope = float(c @ y)
        var_y = (self.spread(quantity) / mean) ** 2 / self.n_seeds  # var of log(mean), delta method
        se = float(np.sqrt(c ** 2 @ var_y)) if self.n_seeds > 1 else math.nan
        return Fit(slope, se, float(y.mean() - slope * u.mean()))

    @property
    def slope(self) -> float:
        """The fitted slope for the NTK (about -0.5)."""
        return self.fit("ntk").slope

    def _cell(self, quantity: str, i: int) -> str:
        return f"{self.mean(quantity)[i]:.4f} ± {self.spread(quantity)[i]:.4f}"

    def _rows(self) -> tuple[list[str], list[list[str]]]:
        header = ["width", *(_label(q) for q in self.errors)]
        rows = [[str(w), *(self._cell(q, i) for q in self.errors)] for i, w in enumerate(self.widths)]
        fits = [self.fit(q) for q in self.errors]
        rows.append(["slope", *map(str, fits)])
        return header, rows

    def _note(self) -> str:
        layers = ("per-layer errors: against the analytic NTK's contribution of each module"
                  if self.layer_reference == "analytic" else
                  "per-layer errors: each module's empirical contribution vs its mean over seeds")
        note = (f"Relative Frobenius error vs the infinite-width limit, mean ± std over "
                f"{self.n_seeds} seeds ({self.parameterization} parameterization); NNGP: "
                f"readout-conditional output covariance; {layers}; slope of log(error) vs "
                f"log(width).")
        uncertain = [f"{_label(q)} {self.fit(q)}" for q in self.errors if self.fit(q).uncertain]
        if uncertain:
            note += (f"\nSlopes too uncertain to tell from -0.5 (or from 0, no convergence): "
                     f"{', '.join(uncertain)}; use more seeds or wider widths.")
        return note

    def __str__(self) -> str:
        header, rows = self._rows()
        widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]
        line = lambda r: " | ".join(c.rjust(w) for c, w in zip(r, widths))
        rule = "-+-".join("-" * w for w in widths)
        return "\n".join([line(header), rule, *map(line, rows[:-1]), rule, line(rows[-1]), "",
                          self._note()])

    def to_markdown(self) -> str:
        """A markdown table (one row per width, then the slopes) and a note on what is measured."""
        header, rows = self._rows()
        md = lambda r: "| " + " | ".join(r) + " |"
        return "\n".join([md(header), md(["---:"] * len(header)), *map(md, rows), "",
                          self._note(), ""])

    def to_csv(self, path: str | None = None) -> str:
        """Long-format CSV (``quantity,width,mean,std,min,max,slope,slope_standard_error``);
        written to ``path`` if given; returns the text."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["quantity", "width", "mean", "std", "min", "max", "slope",
                         "slope_standard_error"])
        for q, e in self.errors.items():
            fit, mean, spread = self.fit(q), self.mean(q), self.spread(q)
            for i, w in enumerate(self.widths):
                writer.writerow([q, w, *(repr(float(v)) for v in (mean[i], spread[i], e[i].min(),
                                                                    e[i].max(), *fit[:2]))])
        text = buffer.getvalue()
        if path is not None:
            with open(path, "w", newline="") as f:
                f.write(text)
        return text

    def to_dict(self) -> dict:
        """Plain data (for JSON): widths, settings, and per quantity the errors and the fit."""
        return {"widths": list(self.widths), "n_seeds": self.n_seeds,
                "parameterization": self.parameterization, "layer_reference": self.layer_reference,
                "quantities": {q: {"errors": e.tolist(), "mean": self.mean(q).tolist(),
                                   "std": self.spread(q).tolist(), "slope": self.fit(q).slope,
                                   "slope_standard_error": self.fit(q).standard_error}
                               for q, e in self.errors.items()}}

    def plot(self, path: str) -> str:
        """Write a log-log PNG of error vs width (mean, with ± std bars) and a ``width**-1/2``
        guide; returns ``path``. Needs matplotlib: ``pip install 'ntbridge[plot]'``."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError("WidthSweep.plot needs matplotlib; install it with "
                              "pip install 'ntbridge[plot]'") from e
        w = np.asarray(self.widths, float)
        fig, ax = plt.subplots(figsize=(6.4, 4.8))
        for q in self.errors:
            main = q in ("ntk", "nngp")
            ax.errorbar(w, self.mean(q), yerr=self.spread(q), capsize=3, marker="o" if main else ".",
                        linestyle="-" if main else "--", linewidth=2 if main else 1,
                        label=f"{_label(q)} (slope {self.fit(q).slope:+.2f})")
        guide = self.mean("ntk")[0] * (w / w[0]) ** -0.5
        ax.plot(w, guide, color="gray", linestyle=":", label="width$^{-1/2}$")
        ax.set(xscale="log", yscale="log", xlabel="width",
               ylabel="relative Frobenius error", title="Finite width vs infinite-width kernels")
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def _label(quantity: str) -> str:
    if quantity in ("ntk", "nngp"):
        return quantity.upper()
    return f"NTK layer '{quantity[4:-1]}'"


def _relative_error(estimate: torch.Tensor, exact: torch.Tensor) -> float:
    estimate, exact = estimate.double(), exact.double()
    return (torch.linalg.norm(estimate - exact) / torch.linalg.norm(exact)).item()


def _is_chain(graph: Graph) -> bool:
    return all(n.inputs == (n.index - 1,) for n in graph.layers)


def analytic_ntk_by_layer(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *,
                          parameterization: str = "standard") -> dict[str, torch.Tensor]:
    """The analytic NTK's contribution of each module with parameters, ``{name: (N1, N2)}``.

    For a chain of modules (``nn.Sequential``); the contributions sum to ``ntbridge.ntk(model, ...)``
    (torch's default init assumed). See the module doc for how they are computed.

    Example:
        >>> parts = analytic_ntk_by_layer(model, x)
        >>> sum(parts.values())  # == ntbridge.ntk(model, x) up to rounding
    """
    parts = _analytic(model, x1, x2, parameterization)[2]
    if parts is None:
        raise InputError("analytic_ntk_by_layer needs a chain of modules (an nn.Sequential); "
                         "this model has residual sums or concatenations.")
    return parts


def _analytic(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, parameterization: str):
    """``(nngp, ntk, {name: contribution} or None for graphs that are not chains, graph)``."""
    def task(graph, x1, x2):
        graph.check_init()
        if not _is_chain(graph):
            return graph.analytic_task(("nngp", "ntk"), platform_of(x1)), None
        owners = tuple(n.index for n in graph.layers if n.param_names)
        return Task(("analytic_by_layer", graph.signature, owners), _suffix_fn(graph, owners),
                    graph.perm, pairwise=graph.network.pairwise), owners

    result, owners, graph = run(Request(model, x1, x2, task,
                                        conversion=dict(parameterization=parameterization)))
    if owners is None:
        return result.nngp, result.ntk, None, graph
    nngp, parts = result
    parts = {graph.layers[j].name: p for j, p in zip(owners, parts)}
    return nngp, sum(parts.values()), parts, graph


def _suffix_fn(graph: Graph, owners: tuple[int, ...]) -> Callable:
    """``fn(args, x1, x2) -> (nngp, [contribution of layer j for j in owners])`` (see module doc)."""
    layers = tuple(n.layer for n in graph.layers)

    def suffix(k, start):
        for i, layer in enumerate(layers):
            if i == start:
                k = k.replace(ntk=jnp.zeros_like(k.ntk))
            k = layer.kernel_fn(k)
        return k

    def fn(args, x1, x2):
        k0 = input_kernel(x1, x2, compute_ntk=True, diagonal_spatial=not graph.network.full_spatial)
        kernels = [suffix(k0, j) for j in owners]
        sums = [k.ntk for k in kernels] + [jnp.zeros_like(kernels[0].ntk)]
        return kernels[0].nngp, [a - b for a, b in zip(sums, sums[1:])]

    return fn


def _readout_nngp(model: nn.Module, graph: Graph, x1: torch.Tensor,
                  x2: torch.Tensor | None) -> torch.Tensor:
    """``W_std**2 h1 h2^T / fan_in + b_std**2``: the output covariance given the readout's inputs."""
    last = graph.layers[-1]  # graph: the architecture; model: this seed's weights
    readout = dict(model.named_modules())[last.name]
    if not isinstance(readout, nn.Linear):
        raise InputError(f"width_sweep needs a model whose output is a final nn.Linear (its readout); "
                         f"the last module is {last.where}.")
    features = []
    hook = readout.register_forward_hook(lambda m, inputs, out: features.append(inputs[0]))
    try:
        with torch.no_grad():
            for x in (x1, x2 if x2 is not None else x1):
                model(x)
    finally:
        hook.remove()
    h1, h2 = (h.reshape(h.shape[0], -1).double() for h in features)
    W_std, b_std = last.hyper["W_std"], last.hyper["b_std"]
    return W_std ** 2 * (h1 @ h2.T) / readout.in_features + (b_std ** 2 if b_std else 0.0)


def _ntk_parameterization_factors(graph: Graph) -> dict[str, float]:
    """Per module, the factor turning its standard-parameterization NTK contribution into the NTK
    parameterization's: ``W_std**2 / fan_in`` for the weight and ``b_std**2`` for the bias, which
    must agree (they do for torch's default init: ``1 / (3 fan_in)``)."""
    factors = {}
    for n in graph.layers:
        if not n.param_names:
            continue
        if "W_std" not in n.hyper:
            raise InputError(f"parameterization='ntk' needs affine modules only; {n.where} is not.")
        w = n.hyper["W_std"] ** 2 / n.module.weight[0].numel()
        b = n.hyper.get("b_std")
        if b is not None and not math.isclose(w, b ** 2, rel_tol=1e-9):
            raise InputError(f"parameterization='ntk' rescales each module's NTK contribution, which "
                             f"needs W_std**2/fan_in == b_std**2 (torch's default init); {n.where} "
                             f"has {w:.3g} and {b ** 2:.3g}. Use parameterization='standard'.")
        factors[n.name] = w
    return factors


def width_sweep(build: Callable[[int], nn.Module], widths: Sequence[int], x1: torch.Tensor,
                x2: torch.Tensor | None = None, *, n_seeds: int = 3,
                parameterization: str = "standard", seed: int = 0,
                implementation: str = "auto", progress: bool = False) -> WidthSweep:
    """Finite-width kernels of freshly initialised models vs their infinite-width limits.

    Args:
      build: ``build(width) -> nn.Module``, a model with torch's default init whose output is a
        final ``nn.Linear`` (called once per width and seed, under ``torch.manual_seed``).
      widths: the widths to try (at least two distinct ones for a slope).
      x1: ``(N1, *input_shape)``; x2: ``(N2, ...)`` or None for x2 = x1.
      n_seeds: models per width (>= 2 for a spread).
      parameterization: ``"standard"`` (torch's own; the analytic NTK uses the actual widths) or
        ``"ntk"`` (each module's empirical contribution rescaled to the NTK parameterization, whose
        limit is width-independent).
      seed: the model of width ``w`` and seed ``s`` is built after seeding torch with
        ``ntbridge.empirical.reinit.sample_seed(seed, w, s)`` (``numpy.random.SeedSequence([seed,
        w, s])``): independent draws across widths and seeds
        (the global RNG state is restored afterwards).
      implementation: of the empirical NTK (see ``ntbridge.empirical_ntk``).
      progress: a progress bar on stderr.

    Returns:
      A :class:`WidthSweep` (prints as a table; ``to_markdown``, ``to_csv``, ``plot``, ``fit``).

    Example:
        >>> sweep = width_sweep(lambda w: nn.Sequential(nn.Linear(8, w), nn.ReLU(), nn.Linear(w, 1)),
        ...                     [64, 256, 1024], torch.randn(6, 8), n_seeds=3)
        >>> round(sweep.slope, 1)
        -0.5
    """
    widths = _check_widths(widths)
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
        raise InputError(f"n_seeds must be a positive int, got {n_seeds!r}.")
    if parameterization not in ("standard", "ntk"):
        raise InputError(f"parameterization must be 'standard' or 'ntk', got {parameterization!r}.")
    errors: dict[str, np.ndarray] = {}
    layer_reference = "analytic"
    bar = _progress(len(widths) * n_seeds, progress)
    for i, width in enumerate(widths):
        for s in range(n_seeds):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(sample_seed(seed, width, s))
                model = build(width)
            if not isinstance(model, nn.Module):
                raise InputTypeError(f"build({width}) must return a torch.nn.Module, got "
                                     f"{type(model).__name__}.")
            model = model.to(x1.dtype) if x1.is_floating_point() else model
            if s == 0:
                nngp, ntk, layers, graph = _analytic(model, x1, x2, parameterization)
                factors = (_ntk_parameterization_factors(graph) if parameterization == "ntk"
                           else {n.name: 1.0 for n in graph.layers if n.param_names})
                layer_reference = "analytic" if layers is not None else SEED_SPREAD
                samples = []
            parts = {name: k * factors[name]
                     for name, k in empirical_ntk(model, x1, x2, by_layer=True,
                                                 implementation=implementation).items()}
            values = {"ntk": _relative_error(sum(parts.values()), ntk),
                      "nngp": _relative_error(_readout_nngp(model, graph, x1, x2), nngp)}
            if layers is not None:
                values |= {f"ntk[{n}]": _relative_error(k, layers[n]) for n, k in parts.items()}
            samples.append((values, parts))
            bar.update()
        if layers is None:
            samples = _seed_spread(samples)
        for q in samples[0][0]:
            errors.setdefault(q, np.zeros((len(widths), n_seeds)))[i] = [v[q] for v, _ in samples]
    bar.close()
    return WidthSweep(tuple(widths), errors, parameterization, layer_reference)


def _seed_spread(samples: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """Add ``ntk[NAME]``: each seed's contribution's relative deviation from the mean over seeds."""
    if len(samples) < 2:
        return samples
    names = samples[0][1]
    means = {n: sum(p[n] for _, p in samples) / len(samples) for n in names}
    return [(values | {f"ntk[{n}]": _relative_error(parts[n], means[n]) for n in names}, parts)
            for values, parts in samples]


def _check_widths(widths: Sequence[int]) -> list[int]:
    try:
        widths = [int(w) for w in widths]
    except (TypeError, ValueError):
        raise InputTypeError(f"widths must be a sequence of ints, got {widths!r}.") from None
    if not widths or min(widths) < 1:
        raise InputError(f"widths must be positive ints, got {widths!r}.")
    return widths


def _progress(total: int, show: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="width sweep", unit="model", disable=not show, leave=False)
