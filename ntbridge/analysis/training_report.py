"""The result of a training sweep and its report: a table and a plot.

Example:
    >>> sweep = TrainingSweep((64, 256), (0, 100), {"linearized": np.ones((2, 3, 2))}, (0.1, 0.02))
    >>> sweep.mean("linearized").shape
    (2, 2)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .report import aligned, pyplot

_LABELS = {"linearized": "model vs linearized", "infinite": "model vs infinite width"}


@dataclasses.dataclass(frozen=True)
class TrainingSweep:
    """The result of :func:`ntbridge.analysis.training_sweep`.

    Attributes:
      widths: the widths, in the order given.
      steps: the steps recorded (0 first when asked).
      distances: ``"linearized"`` / ``"infinite"`` -> the test points' rms distance of the trained
        model's outputs to its linearization's / to the infinite-width dynamics',
        an array ``(len(widths), n_seeds, len(steps))``.
      learning_rates: the step size used at each width.
    """

    widths: tuple[int, ...]
    steps: tuple[int, ...]
    distances: dict[str, np.ndarray]
    learning_rates: tuple[float, ...]

    @property
    def n_seeds(self) -> int:
        return next(iter(self.distances.values())).shape[1]

    def mean(self, quantity: str = "linearized") -> np.ndarray:
        """Mean distance over seeds, ``(len(widths), len(steps))``."""
        return self.distances[quantity].mean(axis=1)

    def standard_error(self, quantity: str = "linearized") -> np.ndarray:
        """Standard error of :meth:`mean` (sample std / sqrt(seeds); NaN with one seed)."""
        d = self.distances[quantity]
        if self.n_seeds < 2:
            return np.full(self.mean(quantity).shape, np.nan)
        return d.std(axis=1, ddof=1) / np.sqrt(self.n_seeds)

    def __repr__(self) -> str:
        final = ", ".join(f"{q} {self.mean(q)[-1, -1]:.3g}" for q in self.distances)
        return (f"TrainingSweep(widths={self.widths}, steps={self.steps}, n_seeds={self.n_seeds}, "
                f"at the widest and last step: {final})")

    def _cell(self, quantity: str, i: int, j: int) -> str:
        mean, se = self.mean(quantity)[i, j], self.standard_error(quantity)[i, j]
        return f"{mean:.2e}" if np.isnan(se) else f"{mean:.2e} ± {se:.1e}"

    def __str__(self) -> str:
        header = ["width", "learning rate", *(f"step {s}" for s in self.steps)]
        lines = []
        for q in self.distances:
            rows = [[str(w), f"{lr:.3g}", *(self._cell(q, i, j) for j in range(len(self.steps)))]
                    for i, (w, lr) in enumerate(zip(self.widths, self.learning_rates))]
            line, rule = aligned(header, rows)
            lines += [f"{_LABELS[q]}:", line(header), rule, *map(line, rows), ""]
        seeds = f"{self.n_seeds} seed{'s' * (self.n_seeds > 1)}"
        lines.append(f"RMS distance of the trained model's test outputs, mean ± standard error over "
                     f"{seeds}; full-batch gradient descent on 1/2 sum |f - y|^2.")
        return "\n".join(lines)

    def plot(self, path: str) -> str:
        """Write a PNG: the distances against the step, one line per width, one panel per
        quantity (log scale); returns ``path``. Needs matplotlib: ``pip install 'ntbridge[plot]'``."""
        plt = pyplot("TrainingSweep.plot")
        fig, axes = plt.subplots(1, len(self.distances), figsize=(5.2 * len(self.distances), 4.2),
                                 squeeze=False)
        shown = [j for j, s in enumerate(self.steps) if s > 0]  # distances are 0 at step 0
        for ax, q in zip(axes[0], self.distances):
            for i, w in enumerate(self.widths):
                se = np.nan_to_num(self.standard_error(q)[i, shown])
                ax.errorbar(np.asarray(self.steps)[shown], self.mean(q)[i, shown], yerr=se,
                            marker="o", capsize=3, label=f"width {w}")
            ax.set(yscale="log", xlabel="step", ylabel="rms distance (test points)",
                   title=_LABELS[q])
            ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path
