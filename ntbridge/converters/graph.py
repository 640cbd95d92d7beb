"""``Graph``: a torch model translated to a stax network, with its parameters as JAX arrays."""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any, NamedTuple

import jax
import torch
from torch import nn

from .. import programs
from ..dlpack import describe
from ..errors import InitMismatchWarning, InputError, NtbridgeError, UnsupportedLayerError
from ..stax import INPUT, Kernel, Layer, dag, input_kernel
from ..stax.covariances import Covariances, own_covariances, with_covariances
from ..stax.kernel import swap_perm, symmetrize
from ..tiling import Task
from ..tiling.blocks import in_blocks, splits
from .registry import Context, Options, find_converter, init_mismatch, supported_types

Params = dict[str, jax.Array]
KERNEL_NAMES = ("nngp", "ntk")


class Kernels(NamedTuple):
    """The analytic kernels asked for with ``get``; those not asked for are None.

    Example:
        >>> k = ntbridge.kernel(model, torch.randn(20, 16), torch.randn(5, 16))
        >>> k                        # a summary; the values are k.nngp and k.ntk
        Kernels(nngp=(20, 5) float32 cpu, ntk=(20, 5) float32 cpu)
    """

    nngp: Any = None
    ntk: Any = None

    def __repr__(self) -> str:
        kernels = (f"{name}={'None' if k is None else describe(k)}"
                   for name, k in self._asdict().items())
        return f"Kernels({', '.join(kernels)})"


@dataclasses.dataclass(frozen=True)
class Node:
    """One leaf module of the model and the stax layer it became."""

    index: int
    name: str
    module: nn.Module
    layer: Layer
    param_names: tuple[str, ...]
    hyper: dict
    inputs: tuple[int, ...]  # the nodes feeding this one; stax.INPUT (-1) is the model's input
    init_checks: tuple = ()  # (label, tensor, fan_in) the analytic kernel assumes torch-initialised
    origin: str = ""  # a functional call's operation and enclosing module (fx), for error messages

    def __repr__(self) -> str:
        """``(name): Module(...)`` and its hyper-parameters, e.g.
        ``(0): Linear(in_features=3, out_features=8, bias=True) W_std=0.577 b_std=0.333``."""
        hyper = "".join(f" {k}={v:.3g}" for k, v in self.hyper.items() if v is not None)
        return f"({self.name}): {self.module!r}{hyper}"

    @property
    def where(self) -> str:
        """How error messages name this module: position, qualified name and type; for a functional
        call in a traced forward, the operation and the user's module around it."""
        return self.origin or f"module {self.index} '{self.name}' ({type(self.module).__name__})"

    def key(self, param: str) -> str:
        return f"{self.name}.{param}" if self.name else param

    def owner(self, param: str) -> str:
        """The qualified name of the module owning ``param`` (for ``by_layer``): this one."""
        return self.name


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters(recurse=False)),
            **dict(module.named_buffers(recurse=False))}


def make_node(index: int, name: str, module: nn.Module, inputs: tuple[int, ...],
              options: Options, origin: str = "") -> Node:
    """Convert ``module`` (qualified name ``name``, fed by nodes ``inputs``; ``origin``: see
    :class:`Node`) with its registered converter; raises UnsupportedLayerError naming it if it has
    none."""
    converter = find_converter(module)
    if converter is None:
        raise UnsupportedLayerError(
            f"module {index} '{name}' ({type(module).__name__}) has no converter. Supported module "
            f"types: {', '.join(supported_types())}. Register one with "
            f"@ntbridge.register_converter({type(module).__name__}), or build the model from "
            f"supported modules.")
    for key, t in _tensors(module).items():
        if t.numel() == 0:
            raise InputError(f"module {index} '{name}' ({type(module).__name__}) has a zero-size "
                             f"{key} (shape {tuple(t.shape)}): a layer without units or inputs "
                             f"has no kernel; give it at least one, or remove it.")
    ctx = Context(name, index, options)
    layer = converter(module, ctx)
    return Node(index, name, module, layer, tuple(_tensors(module)), ctx.hyper, inputs,
                ctx.init_checks, origin)


def module_tensors(nodes: list[Node]) -> dict[str, torch.Tensor]:
    """The parameters and buffers of the nodes' modules, keyed by qualified name."""
    return {n.key(p): t for n in nodes for p, t in _tensors(n.module).items()}


def _located(layer: Layer, where: str) -> Layer:
    """The same layer, whose errors name the module they come from."""

    def wrap(fn):
        def located(*args):
            try:
                return fn(*args)
            except NtbridgeError as e:
                raise type(e)(f"{where}: {e}") from None
        return located

    return layer._replace(init_fn=wrap(layer.init_fn), kernel_fn=wrap(layer.kernel_fn))


def _apply(network: Layer, layout: tuple, params: Params, x: jax.Array) -> jax.Array:
    per_layer = tuple({local: params[key] for local, key in node} for node in layout)
    return network.apply_fn(per_layer, x)


def _analytic(network: Layer, x1, x2, get, covs: tuple[Covariances, Covariances] | None = None):
    """The kernels ``get`` of x1 and x2; ``covs``: the examples' own covariances at every layer,
    stacked :func:`_own_covariances` of x1 and of x2, used instead of computing them."""
    names = (get,) if isinstance(get, str) else tuple(get)
    k: Kernel = input_kernel(x1, x2, compute_ntk="ntk" in names,
                             diagonal_spatial=not network.full_spatial)
    k = network.kernel_fn(k, after=None if covs is None else with_covariances(*covs))
    out = {name: getattr(k, name) for name in names}
    return out[get] if isinstance(get, str) else Kernels(**out)


def _own_covariances(network: Layer, args, x: jax.Array) -> Covariances:
    """Each example's covariance with itself at every layer, ``(N, ...)`` leaves, for the examples
    x ``(N, ...)`` (``args``, the task's arguments, are not needed)."""
    own = lambda example: own_covariances(network, example, not network.full_spatial)
    return jax.vmap(own)(x)


def _warn_init_mismatch(nodes: tuple[Node, ...]) -> None:
    """One InitMismatchWarning naming every module whose weights contradict torch's default init."""
    found = []
    for n in nodes:
        whys = [f"{label} has {why}" for label, t, fan_in in n.init_checks
                if (why := init_mismatch(t, fan_in))]
        found += [f"{n.where}: {', '.join(whys)}"] if whys else []
    if found:
        warnings.warn(
            "the analytic kernel assumes torch's default init (init='torch'), but "
            + "; ".join(found) + ". Pass init='infer' to use the variances of the current "
            "weights, or W_std=/b_std= (a float or {module name: float}) to state them.",
            InitMismatchWarning, stacklevel=3)


class Graph:
    """A converted model. Params are a flat dict keyed like ``model.named_parameters()``.

    Attributes:
      layers: the :class:`Node` of each leaf module, in order.
      params: JAX arrays sharing memory with the torch weights where the layout allows it.
      signature: a hashable description of the architecture and hyper-parameters.

    Example:
        >>> g = ntbridge.convert(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)))
        >>> g                        # its layers; the torch modules are g.layers[i].module
        Graph(
          (0): Linear(in_features=3, out_features=8, bias=True) W_std=0.577 b_std=0.333
          (1): ReLU()
          (2): Linear(in_features=8, out_features=1, bias=True) W_std=0.577 b_std=0.204
        )
        >>> g.apply_fn(g.params, jnp.ones((5, 3))).shape
        (5, 1)
        >>> g.kernel_fn(jnp.ones((5, 3)), get="ntk").shape
        (5, 5)
    """

    path = "layers"  # how the empirical kernels name this route (vs "torch.export")

    def __init__(self, nodes: list[Node], params: Params, signature: tuple):
        self.layers = tuple(nodes)
        self.params = params
        self.signature = signature
        self.network = dag([_located(n.layer, n.where) for n in nodes], [n.inputs for n in nodes])
        layout = tuple(tuple((p, n.key(p)) for p in n.param_names) for n in nodes)
        self.apply_fn = functools.partial(_apply, self.network, layout)
        """The model's forward pass ``apply_fn(params, x)``, ``(N, *input) -> (N, *output)``."""
        self._init_checked = False

    def __repr__(self) -> str:
        """One line per layer (see the class example); ``<- a, b`` names the layers feeding one
        that is not fed by the layer before it alone."""
        names = lambda inputs: ", ".join("input" if i == INPUT else self.layers[i].name
                                         for i in inputs)
        lines = [f"  {n!r}" + ("" if n.inputs == (n.index - 1,) else f" <- {names(n.inputs)}")
                 for n in self.layers]
        return "\n".join(["Graph(", *lines, ")"])

    @property
    def parameter_names(self) -> frozenset[str]:
        """The keys of ``params`` that are torch parameters (the others are buffers)."""
        return frozenset(n.key(p) for n in self.layers
                         for p, _ in n.module.named_parameters(recurse=False))

    def init_fn(self, key: jax.Array, input_shape: tuple[int, ...]) -> tuple[tuple, Params]:
        """Fresh parameters from the init distribution in use; returns ``(output_shape, params)``."""
        shape, per_layer = self.network.init_fn(key, tuple(input_shape))
        return shape, {n.key(p): v for n, lp in zip(self.layers, per_layer) for p, v in lp.items()}

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The torch parameters and buffers ``params`` were read from, by name."""
        return module_tensors(self.layers)

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The output shape for inputs of ``input_shape``; raises ShapeError if they do not fit."""
        def trace():  # cached per architecture and shape: tracing it takes milliseconds per call
            result = []
            init = lambda: result.append(self.network.init_fn(jax.random.key(0),
                                                              tuple(input_shape))[0])
            jax.eval_shape(init)
            return result[0]

        key = programs.ProgramKey.of("output shape", self.signature,
                                     jax.ShapeDtypeStruct(tuple(input_shape), "float32"))
        return programs.cached(key, trace)

    def perm(self, ndim: int) -> tuple[int, ...]:
        """The axes exchanging x1 and x2 in an analytic kernel array of rank ``ndim``."""
        return swap_perm(ndim, not self.network.full_spatial)

    def analytic_task(self, get: str | tuple[str, ...] = KERNEL_NAMES,
                      platform: str | None = None) -> Task:
        """The infinite-width kernels ``get`` as a task for :func:`ntbridge.tiling.compute` on
        ``platform`` (the inputs'): on CPUs, each tile is computed in blocks that stay in cache
        (:func:`ntbridge.tiling.blocks.in_blocks`); without full-spatial layers its programs take
        the XLA options of kernels of vectors or of same-position covariances
        (:data:`ntbridge.devices.PROGRAM_OPTIONS`)."""
        fn = lambda args, x1, x2, covs=None: _analytic(self.network, x1, x2, get, covs)
        blocks = platform == "cpu" and self.network.pairwise
        power = 2 if self.network.full_spatial else 1  # pairs of positions, or positions
        pair_bytes = lambda a1: a1.dtype.itemsize * math.prod(a1.shape[2:]) ** power
        own = functools.partial(_own_covariances, self.network)  # once per tile where it pays
        return Task(("analytic", self.signature, get, blocks),
                    in_blocks(fn, pair_bytes, self.perm, own) if blocks else fn, self.perm,
                    pairwise=self.network.pairwise,
                    exactly_symmetric=lambda a1: blocks and splits(a1, None, pair_bytes),
                    program_kind=self._program_kind)

    def _program_kind(self, a1: jax.ShapeDtypeStruct) -> str:
        """The kind of XLA options (:data:`ntbridge.devices.PROGRAM_OPTIONS`) for inputs like a1."""
        if self.network.full_spatial:
            return "default"
        return "vector" if len(a1.shape) == 2 else "diagonal"

    def kernel_fn(self, x1: jax.Array, x2: jax.Array | None = None,
                  get: str | tuple[str, ...] = KERNEL_NAMES):
        """Infinite-width kernels of the outputs, ``(N1, N2)`` per output unit (jit-compiled).

        ``get`` is ``"nngp"``, ``"ntk"`` (an array) or a tuple of them (a :class:`Kernels`).
        With ``x2=None`` the result is exactly symmetric. The first call warns
        (:class:`~ntbridge.errors.InitMismatchWarning`) if weights the kernel assumes
        torch-initialised clearly are not.
        """
        self.check_init()

        key = programs.ProgramKey.of("kernel_fn", (self.signature, get), (x1, x2))
        out = programs.cached(key, lambda: jax.jit(functools.partial(_analytic, self.network),
                                                   static_argnums=2))(x1, x2, get)
        sym = lambda a: a if x2 is not None else symmetrize(a, self.perm(a.ndim))
        return jax.tree.map(sym, out)  # op by op, so exactly symmetric

    def check_init(self) -> None:
        """Warn once (:class:`~ntbridge.errors.InitMismatchWarning`) if weights the analytic kernel
        assumes torch-initialised clearly are not."""
        if not self._init_checked:
            self._init_checked = True
            _warn_init_mismatch(self.layers)
