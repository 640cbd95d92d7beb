"""The result of a width sweep and its report: a table, markdown, CSV, plain data and a plot.

Example:
    >>> sweep = WidthSweep((64, 256), {"ntk": np.array([[0.2, 0.22], [0.1, 0.11]])}, "standard",
    ...                    "analytic")
    >>> round(sweep.slope, 2)
    -0.5
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from typing import Callable, NamedTuple

import numpy as np

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
        """``slope ± standard error``, e.g. ``-0.487 ± 0.021``; ``-0.487`` without a standard error
        (one seed), ``n/a`` without a slope (one width)."""
        if math.isnan(self.slope):
            return "n/a"
        if math.isnan(self.standard_error):
            return f"{self.slope:+.3f}"
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
        mean = f"{self.mean(quantity)[i]:.4f}"
        return mean if self.n_seeds < 2 else f"{mean} ± {self.spread(quantity)[i]:.4f}"

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
        seeds = f"{self.n_seeds} seed{'s' * (self.n_seeds > 1)}"
        note = (f"Relative Frobenius error vs the infinite-width limit, mean ± std over {seeds} "
                f"({self.parameterization} parameterization); NNGP: readout-conditional output "
                f"covariance; {layers}; slope of log(error) vs log(width).")
        if len(set(self.widths)) < 2:
            note += "\nNo slope: a slope needs at least two distinct widths."
        elif self.n_seeds < 2:
            note += ("\nOne seed: no spread per width and no standard error of the slopes; use "
                     "n_seeds >= 2.")
        elif uncertain := [f"{_label(q)} {self.fit(q)}" for q in self.errors
                           if self.fit(q).uncertain]:
            note += (f"\nSlopes too uncertain to tell from -0.5 (or from 0, no convergence): "
                     f"{', '.join(uncertain)}; use more seeds or wider widths.")
        return note

    def __str__(self) -> str:
        header, rows = self._rows()
        line, rule = aligned(header, rows)
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
        plt = pyplot("WidthSweep.plot")
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


def aligned(header: list[str], rows: list[list[str]]) -> tuple[Callable[[list[str]], str], str]:
    """``(line, rule)``: ``line(row)`` right-aligns each cell to its column's widest, ``rule`` is
    the line under the header."""
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]
    return (lambda r: " | ".join(c.rjust(w) for c, w in zip(r, widths)),
            "-+-".join("-" * w for w in widths))


def pyplot(caller: str):
    """matplotlib's pyplot (Agg backend), or an ImportError saying that ``caller`` needs it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(f"{caller} needs matplotlib; install it with "
                          f"pip install 'ntbridge[plot]'") from e
    return plt


def _label(quantity: str) -> str:
    """How a quantity is named in the report: ``NTK``, ``NNGP``, ``NTK layer 'NAME'``."""
    if quantity in ("ntk", "nngp"):
        return quantity.upper()
    return f"NTK layer '{quantity[4:-1]}'"

