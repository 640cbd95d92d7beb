"""A torch model's infinite-width NNGP and NTK as GPyTorch kernels, with learnable standard deviations.

:class:`NNGPKernel` and :class:`NTKKernel` are ``gpytorch.kernels.Kernel``\\ s: they work inside an
``ExactGP``, a ``ScaleKernel``, GPyTorch's training loop and BoTorch's ``SingleTaskGP``. Each call
is :func:`ntbridge.kernel` of the model's architecture (its weights do not matter) with
``W_std=weight_std`` and ``b_std=bias_std`` for every affine layer, positive (GPyTorch's
``Positive`` constraint on ``raw_weight_std`` and ``raw_bias_std``), whose gradients ntbridge's
kernels carry (as those of the inputs, which BoTorch's acquisition optimisers use).

* Which are learned: ``learn=("bias_std",)`` by default; ``weight_std`` stays fixed (1.0 unless
  given; its ``raw_weight_std`` does not require grad, so optimisers leave it). The overall scale
  belongs to a ``ScaleKernel``'s ``outputscale``: for a ReLU network (any positively homogeneous
  activation) scaling every ``W_std`` and ``b_std`` together scales the kernel and shifts the
  depth-wise balance of the biases only, so with ``weight_std`` free it trades off against the
  outputscale, and fits drift to huge standard deviations and a vanishing outputscale (e.g.
  ``weight_std`` 29, ``bias_std`` 18, outputscale 1e-6 on 16 points), gaining little likelihood.
  With ``weight_std`` fixed, ``bias_std`` is the bias-to-weight ratio, the kernel's shape, and the
  fit is identifiable (the same problem: ``bias_std`` 0.41, outputscale 1.0, a marginal likelihood
  0.01 nats per point lower). ``learn=("weight_std", "bias_std")`` learns both, as before (for
  activations that are not homogeneous, e.g. tanh or erf, ``weight_std`` shapes the kernel too).

* Batches: ``batch_shape=torch.Size([B])`` gives each batch its own ``weight_std`` and
  ``bias_std`` ``(B, 1, 1)``; inputs ``(..., N, D)`` broadcast against it. Each batch is one
  ntbridge call; the standard deviations are arguments of ntbridge's compiled program, so every
  value runs the same program.
* ``diag=True``: the kernels of blocks of ``diag_block`` examples with themselves, their diagonals
  (``N * diag_block`` pairs rather than ``N**2``).
* ``last_dim_is_batch`` (deprecated in GPyTorch) is refused: the kernel is one of whole inputs.
* Large training sets: above ``gpytorch.settings.max_cholesky_size`` (800 by default) GPyTorch
  solves with conjugate gradients and estimates log-determinants by Lanczos instead of factorising;
  ntbridge computes the matrix they multiply by in tiles of ``batch_size`` examples, so the memory
  is the ``N x N`` result plus a tile.
* Inputs are rows ``(N, D)``, as GPyTorch passes them; ``input_shape=(C, H, W)`` reshapes each row
  for a model of images.

GPyTorch is an optional dependency (``pip install 'ntbridge[gp]'``), imported by this module only;
versions outside :data:`TESTED_VERSIONS` raise :class:`~ntbridge.errors.DependencyError`.

Example:
    >>> mlp = nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 1))
    >>> gp = botorch.models.SingleTaskGP(x, y, covar_module=ScaleKernel(NTKKernel(mlp)))
    >>> botorch.fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
"""

from __future__ import annotations

import re
from typing import Sequence

import torch
from torch import nn

from ..api import kernel
from ..converters import convert
from ..dlpack import check_module
from ..errors import DependencyError, InputError

TESTED_VERSIONS = ((1, 15), (2, 0))  # GPyTorch versions this module is tested with: [1.15, 2.0)


def check_version(version: str) -> None:
    """DependencyError unless GPyTorch ``version`` (e.g. ``"1.15.2"``) is in
    :data:`TESTED_VERSIONS`.

    Example:
        >>> check_version("1.15.2")
    """
    major_minor = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    low, high = TESTED_VERSIONS
    if not low <= major_minor < high:
        raise DependencyError(
            f"ntbridge.gpytorch is tested with GPyTorch >= {'.'.join(map(str, low))} and < "
            f"{'.'.join(map(str, high))}, but GPyTorch {version} is installed; install a tested "
            f"version: pip install 'ntbridge[gp]'.")


try:
    import gpytorch
except ImportError as e:
    raise DependencyError("ntbridge.gpytorch needs GPyTorch: pip install 'ntbridge[gp]'.") from e
check_version(gpytorch.__version__)


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise InputError(f"{name} must be a positive finite float (its constraint is Positive), "
                         f"got {value!r}.")
    return float(value)


class _NetworkKernel(gpytorch.kernels.Kernel):
    """The kernel ``get`` of ``model``'s architecture (see the module doc); subclasses set ``get``.

    Args:
      model: a torch model that :func:`ntbridge.convert` converts (its weights do not matter).
      weight_std, bias_std: initial ``W_std`` and ``b_std`` of every affine layer (positive).
      learn: the hyper-parameters to learn, of ``("weight_std", "bias_std")``; the others are
        fixed (their raw parameters do not require grad). Default: ``bias_std`` only (see the
        module doc: the identifiable choice with a ``ScaleKernel``).
      input_shape: the shape of one example for the model, when rows ``(D,)`` must be reshaped.
      parameterization: ``"standard"`` or ``"ntk"``, as :func:`ntbridge.kernel`.
      batch_size: ntbridge's tiles of examples (None: its own choice from the free memory).
      diag_block: examples per block of the diagonal (``diag=True``).
      batch_shape, active_dims: as every GPyTorch kernel.
    """

    has_lengthscale = False
    get = ""

    def __init__(self, model: nn.Module, *, weight_std: float = 1.0, bias_std: float = 0.1,
                 learn: Sequence[str] = ("bias_std",), input_shape: Sequence[int] | None = None, parameterization: str = "standard",
                 batch_size: int | None = None, diag_block: int = 256,
                 batch_shape: torch.Size | None = None, active_dims: Sequence[int] | None = None):
        check_module(model)
        if isinstance(learn, str) or not set(learn) <= {"weight_std", "bias_std"}:
            raise InputError(f"learn must be a tuple of names from ('weight_std', 'bias_std'), got "
                             f"{learn!r}.")
        convert(model, parameterization=parameterization)  # modules without a converter fail here
        super().__init__(batch_shape=batch_shape, active_dims=active_dims)
        self.__dict__["network"] = model  # not a submodule: its weights are no hyper-parameters
        self.input_shape = None if input_shape is None else tuple(input_shape)
        self.options = dict(parameterization=parameterization, batch_size=batch_size)
        self.diag_block = diag_block
        for name, value in (("weight_std", weight_std), ("bias_std", bias_std)):
            _positive(value, name)
            self.register_parameter(f"raw_{name}",
                                    nn.Parameter(torch.zeros(*self.batch_shape, 1, 1)))
            self.register_constraint(f"raw_{name}", gpytorch.constraints.Positive())
            setattr(self, name, value)
            getattr(self, f"raw_{name}").requires_grad_(name in learn)

    @property
    def weight_std(self) -> torch.Tensor:
        """``W_std`` of every affine layer, ``(*batch_shape, 1, 1)``."""
        return self.raw_weight_std_constraint.transform(self.raw_weight_std)

    @weight_std.setter
    def weight_std(self, value) -> None:
        raw = self.raw_weight_std
        value = torch.as_tensor(value, dtype=raw.dtype, device=raw.device)
        self.initialize(raw_weight_std=self.raw_weight_std_constraint.inverse_transform(value))

    @property
    def bias_std(self) -> torch.Tensor:
        """``b_std`` of every layer with a bias, ``(*batch_shape, 1, 1)``."""
        return self.raw_bias_std_constraint.transform(self.raw_bias_std)

    @bias_std.setter
    def bias_std(self, value) -> None:
        raw = self.raw_bias_std
        value = torch.as_tensor(value, dtype=raw.dtype, device=raw.device)
        self.initialize(raw_bias_std=self.raw_bias_std_constraint.inverse_transform(value))

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False,
                last_dim_is_batch: bool = False, **params) -> torch.Tensor:
        """``(*batch, N, M)`` kernels of x1 ``(..., N, D)`` and x2 ``(..., M, D)``, or their
        diagonals ``(*batch, N)`` with ``diag`` (N == M), ``batch`` the broadcast of their batch
        shapes and ``batch_shape``."""
        if last_dim_is_batch:
            raise InputError(f"{type(self).__name__} does not support last_dim_is_batch (deprecated "
                             f"in GPyTorch): its kernel is one of whole inputs. For additive "
                             f"structure, sum kernels over active_dims instead.")
        same = x1 is x2 or (x1.shape == x2.shape and not x2.requires_grad and torch.equal(x1, x2))
        batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2], self.batch_shape)
        if x1.shape[-2] == 0 or x2.shape[-2] == 0:  # no examples: empty, as GPyTorch's kernels
            return x1.new_zeros(*batch, x1.shape[-2], *(() if diag else (x2.shape[-2],)))
        flat = lambda t: t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])
        a, c = flat(x1), flat(x2)
        W, b = (s.expand(*batch, 1, 1).reshape(-1) for s in (self.weight_std, self.bias_std))
        out = torch.stack([self._kernel(a[i], None if same else c[i], W[i], b[i], diag)
                           for i in range(len(W))])
        return out.reshape(*batch, *out.shape[1:])

    def _kernel(self, x1: torch.Tensor, x2: torch.Tensor | None, W: torch.Tensor,
                b: torch.Tensor, diag: bool) -> torch.Tensor:
        """One batch's kernel ``(N, M)`` (or its diagonal ``(N,)``) of rows x1 ``(N, D)`` and x2
        ``(M, D)`` (None: x1 with itself)."""
        examples = lambda x: x if self.input_shape is None else x.reshape(len(x), *self.input_shape)
        x1, x2 = examples(x1), None if x2 is None else examples(x2)
        call = lambda a, c: kernel(self.network, a, c, self.get, W_std=W, b_std=b, **self.options)
        if not diag:
            return call(x1, x2)
        blocks = zip(x1.split(self.diag_block), [None] * len(x1) if x2 is None
                     else x2.split(self.diag_block))
        return torch.cat([call(a, c).diagonal() for a, c in blocks])


class NNGPKernel(_NetworkKernel):
    """The infinite-width NNGP of ``model``'s architecture as a GPyTorch kernel; options as
    :class:`_NetworkKernel` (see the module doc).

    Example:
        >>> k = NNGPKernel(nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 1)))
        >>> k(torch.randn(5, 8)).to_dense().shape
        torch.Size([5, 5])
    """

    get = "nngp"


class NTKKernel(_NetworkKernel):
    """The infinite-width NTK of ``model``'s architecture as a GPyTorch kernel; options as
    :class:`_NetworkKernel` (see the module doc).

    Example:
        >>> k = gpytorch.kernels.ScaleKernel(NTKKernel(mlp, weight_std=1.4, bias_std=0.1))
        >>> k(x1, x2).to_dense().shape
        torch.Size([20, 5])
    """

    get = "ntk"
