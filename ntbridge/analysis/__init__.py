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

The sweep (the computation) is :mod:`.sweep`; its result and report (table, markdown, CSV, plot)
:mod:`.report`.

:func:`training_sweep` (:mod:`.training`, report :mod:`.training_report`) trains models of
growing width by full-batch gradient descent beside their linearizations and the infinite-width
dynamics, and reports the function-space distances over training steps and widths.
"""

from .report import SEED_SPREAD, Fit, WidthSweep
from .sweep import analytic_ntk_by_layer, width_sweep
from .training import training_sweep
from .training_report import TrainingSweep

__all__ = ["SEED_SPREAD", "Fit", "TrainingSweep", "WidthSweep", "analytic_ntk_by_layer",
           "training_sweep", "width_sweep"]
