"""``Graph``: a torch model translated to a stax network, with its parameters as JAX arrays (a
record: what runs on it is planned by :mod:`ntbridge.analytic` and :mod:`ntbridge.empirical`)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import torch
from torch import nn

from .. import programs
from ..dlpack import precision, to_jax
from ..errors import InitMismatchWarning, InputError, NtbridgeError, UnsupportedLayerError, warn
from ..results import Kernels
from ..specs import KERNEL_NAMES
from ..stax import INPUT, Layer, Rule, dag
from ..stax.covariances import evaluate
from ..stax.kernel import swap_perm
from ..tiling.arrays import symmetrize
from .aggregation import NodeFeatures
from .geometric import GeometricFeatures, GlobalPool
from .registry import Context, Options, as_float, find_converter, init_mismatch, supported_types

Params = dict[str, jax.Array]


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
        hyper = "".join(f" {k}={as_float(v):.3g}" if isinstance(v, (float, torch.Tensor))
                        else f" {k}={v!r}" for k, v in self.hyper.items() if v is not None)
        return f"({self.name}): {self.module!r}{hyper}"

    @property
    def where(self) -> str:
        """How error messages name this module: position, qualified name and type; for a functional
        call in a traced forward, the operation and the user's module around it."""
        return self.origin or module_where(self.index, self.name, self.module)

    def key(self, param: str) -> str:
        return f"{self.name}.{param}" if self.name else param

    def owner(self, param: str) -> str:
        """The qualified name of the module owning ``param`` (for ``by_layer``): this one."""
        return self.name


def module_where(index: int, name: str, module: nn.Module) -> str:
    """How messages name a module: ``module 2 'block.conv' (Conv2d)``, or ``the model (MyNet)``
    for the top-level module itself."""
    kind = type(module).__name__
    return f"module {index} '{name}' ({kind})" if name else f"the model ({kind})"


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """A leaf module's parameters and buffers, its submodules' included (attention's
    ``out_proj.weight``, an encoder layer's), by their names within it."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def make_node(index: int, name: str, module: nn.Module, inputs: tuple[int, ...],
              options: Options, origin: str = "", call: dict | None = None) -> Node:
    """Convert ``module`` (qualified name ``name``, fed by nodes ``inputs``; ``origin``: see
    :class:`Node`; ``call``: the traced call's other arguments) with its registered converter;
    raises UnsupportedLayerError naming it if it has none."""
    converter, where = find_converter(module), module_where(index, name, module)
    if converter is None:
        raise UnsupportedLayerError(
            f"{where} has no infinite-width kernel rule in ntbridge. Its empirical kernels work: "
            f"ntbridge.empirical_ntk(model, x1) (also empirical_nngp and monte_carlo). For the "
            f"analytic kernel, build the model from supported modules (this error's .supported "
            f"lists them) or teach ntbridge this one with "
            f"@ntbridge.register_converter({type(module).__name__}).", supported_types())
    tensors = _tensors(module)
    for key, t in tensors.items():
        if t.numel() == 0:
            raise InputError(f"{where} has a zero-size "
                             f"{key} (shape {tuple(t.shape)}): a layer without units or inputs "
                             f"has no kernel; give it at least one, or remove it.")
    ctx = Context(name, index, options, call=call)
    try:
        layer = converter(module, ctx)
    except NtbridgeError as e:  # a module's option without a rule: name the module
        raise type(e)(f"{origin or where}: {e}") from None
    return Node(index, name, module, layer, tuple(tensors), ctx.hyper, inputs,
                ctx.init_checks, origin)


def module_tensors(nodes: list[Node]) -> dict[str, torch.Tensor]:
    """The parameters and buffers of the nodes' modules, keyed by qualified name."""
    return {n.key(p): t for n in nodes for p, t in _tensors(n.module).items()}


def _located(layer: Layer, where: str) -> Layer:
    """The same layer, whose errors name the module they come from."""

    def wrap(fn):
        def located(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except NtbridgeError as e:
                raise type(e)(f"{where}: {e}") from None
        return located

    return layer._replace(init_fn=wrap(layer.init_fn), kernel_fn=wrap(layer.kernel_fn))


def _apply(network: Layer, layout: tuple, params: Params, x: jax.Array) -> jax.Array:
    per_layer = tuple({local: params[key] for local, key in node} for node in layout)
    return network.apply_fn(per_layer, x)


def _warn_init_mismatch(nodes: tuple[Node, ...]) -> None:
    """One InitMismatchWarning naming every module whose weights contradict torch's default init."""
    found = []
    for n in nodes:
        whys = [f"{label} has {why}" for label, t, fan_in in n.init_checks
                if (why := init_mismatch(t, fan_in))]
        found += [f"{n.where}: {', '.join(whys)}"] if whys else []
    if found:
        warn(InitMismatchWarning(
            "the analytic kernel assumes torch's default init (init='torch'), but "
            + "; ".join(found) + ". Pass init='infer' to use the variances of the current "
            "weights, or W_std=/b_std= (a float or {module name: float}) to state them.",
            tuple(found)))


def _hyper_values(node: Node):
    """The values of ``node``'s declared hyper-parameters: the converter's (``node.hyper``) where
    it states them, else the layer's own."""
    declared = node.layer.hyper
    if not isinstance(declared, dict):
        return declared
    return {name: node.hyper.get(name, value) for name, value in declared.items()}


class Graph:
    """A converted model. Params are a flat dict keyed like ``model.named_parameters()``.

    Attributes:
      layers: the :class:`Node` of each leaf module, in order.
      params: JAX arrays sharing memory with the torch weights where the layout allows it, in
        the model's precision (made on first use: the analytic kernels read none).
      signature: a hashable description of the architecture and hyper-parameters.
      architecture: the signature without the values of the layers' declared hyper-parameters
        (``Layer.hyper``), which the analytic programs take as arguments (:meth:`hyper_args`).
      hyper: per layer, its declared hyper-parameters' values, ``{name: float or torch tensor}``
        (explicit ``W_std``/``b_std`` tensors as the user gave them).

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

    def __init__(self, nodes: list[Node], dtype: torch.dtype, signature: tuple,
                 architecture: tuple, sampling: Rule | None = None):
        self.layers, self._dtype = tuple(nodes), dtype
        self.signature, self.architecture = signature, architecture
        self.hyper = tuple(_hyper_values(n) for n in nodes)
        self.network = dag([_located(n.layer, n.where) for n in nodes],
                           [n.inputs for n in nodes])._replace(sampling=sampling)
        layout = tuple(tuple((p, n.key(p)) for p in n.param_names) for n in nodes)
        self.apply_fn = functools.partial(_apply, self.network, layout)
        """The model's forward pass ``apply_fn(params, x)``, ``(N, *input) -> (N, *output)``."""
        self._init_checked = False

    @functools.cached_property
    def params(self) -> Params:
        with precision(self._dtype):
            return {key: to_jax(t, key) for key, t in module_tensors(self.layers).items()}

    def __repr__(self) -> str:
        """One line per layer (see the class example); ``<- a, b`` names the layers feeding one
        that is not fed by the layer before it alone."""
        names = lambda inputs: ", ".join("input" if i == INPUT else self.layers[i].name
                                         for i in inputs)
        lines = [f"  {n!r}" + ("" if n.inputs == (n.index - 1,) else f" <- {names(n.inputs)}")
                 for n in self.layers]
        return "\n".join(["Graph(", *lines, ")"])

    def hyper_args(self, dtype) -> tuple:
        """:attr:`hyper` as numpy scalars of ``dtype``: the hyper-parameters argument of the
        network's ``kernel_fn`` (see :mod:`ntbridge.stax.layers`). Numpy, not JAX: building them
        compiles nothing, so a process that finds its programs on disk compiles none."""
        return jax.tree.map(lambda v: np.asarray(as_float(v), dtype), self.hyper)

    def hyper_tensors(self) -> dict[tuple[int, str], torch.Tensor]:
        """The torch tensors among :attr:`hyper`, keyed by ``(layer index, name)``."""
        return {(i, name): v for i, values in enumerate(self.hyper) if isinstance(values, dict)
                for name, v in values.items() if isinstance(v, torch.Tensor)}

    @property
    def pair_inputs(self) -> bool:
        """Whether ``forward`` takes node features and each example's graph, ``(x, adjacency)``:
        the network then reads them packed into one array (:func:`~.aggregation.pack`)."""
        return any(isinstance(n.module, NodeFeatures) for n in self.layers)

    @property
    def nodes_first(self) -> bool:
        """Whether ``forward(x, adjacency)`` reads ``x (N, V, C)``, nodes first (``adjacency @ h``)."""
        return any(isinstance(n.module, NodeFeatures) and n.module.nodes_first
                   for n in self.layers)

    @property
    def geometric_inputs(self) -> bool:
        """Whether ``forward`` is a PyTorch Geometric model's, ``forward(x, edge_index, ...)``,
        reading ``Data`` packed into one array (:mod:`.geometric_inputs`)."""
        return any(isinstance(n.module, GeometricFeatures) for n in self.layers)

    @property
    def pooled(self) -> bool:
        """Whether the model pools each graph (``global_mean_pool``): one output row per graph."""
        return any(isinstance(n.module, GlobalPool) for n in self.layers)

    @property
    def parameter_names(self) -> frozenset[str]:
        """The keys of ``params`` that are torch parameters (the others are buffers)."""
        return frozenset(n.key(p) for n in self.layers
                         for p, _ in n.module.named_parameters())

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

    def kernel_fn(self, x1: jax.Array, x2: jax.Array | None = None,
                  get: str | tuple[str, ...] = KERNEL_NAMES):
        """Infinite-width kernels of the outputs, ``(N1, N2)`` per output unit (jit-compiled).

        ``get`` is ``"nngp"``, ``"ntk"`` (an array) or a tuple of them (a :class:`Kernels`).
        With ``x2=None`` the result is exactly symmetric. The first call warns
        (:class:`~ntbridge.errors.InitMismatchWarning`) if weights the kernel assumes
        torch-initialised clearly are not.
        """
        self.check_init()

        names = (get,) if isinstance(get, str) else tuple(get)
        hyper = self.hyper_args(x1.dtype)
        key = programs.ProgramKey.of("kernel_fn", (self.architecture, names), (x1, x2, hyper))
        run = lambda x1, x2, hyper: evaluate(self.network, x1, x2, names, None, hyper)
        out = programs.cached(key, lambda: jax.jit(run))(x1, x2, hyper)
        diagonal = not self.network.full_spatial
        sym = lambda a: a if x2 is not None else symmetrize(a, swap_perm(a.ndim, diagonal))
        return Kernels.pick(jax.tree.map(sym, out), get)  # op by op, so exactly symmetric

    def check_init(self) -> None:
        """Warn once (:class:`~ntbridge.errors.InitMismatchWarning`) if weights the analytic kernel
        assumes torch-initialised clearly are not."""
        if not self._init_checked:
            self._init_checked = True
            _warn_init_mismatch(self.layers)
