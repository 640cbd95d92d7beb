"""PyTorch Geometric's layers (``GCNConv``, ``GraphConv``, ``SAGEConv``, ``GINConv``,
``global_mean_pool``/``global_add_pool``), converted to ``stax.MessagePassing`` by the qualified
names of their types, so that ntbridge never imports the library itself; the stand-ins of a traced
PyG ``forward(x, edge_index, ...)`` (:class:`GeometricFeatures`, :class:`GlobalPool`).

Each layer's initialisation is read as PyG makes it (``reset_parameters``): its ``Linear`` layers
draw ``kaiming_uniform(a=sqrt(5))`` weights and ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` biases as
torch's ``nn.Linear`` (``W_std**2 = 1/3``, ``b_std**2 = 1/(3 fan_in)``), except ``GCNConv``'s:
glorot weights (``W_std**2 = 2 fan_in / (fan_in + fan_out)``) and a zero bias.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from .. import stax
from ..errors import UnsupportedLayerError
from ..stax.message_passing import Branch, parts
from .registry import Context, find_converter, register, register_by_name

CONV = "torch_geometric.nn.conv."
SUPPORTED = ("GCNConv, GraphConv, SAGEConv (mean or sum), GINConv (train_eps=False for the "
             "analytic kernels), global_mean_pool and global_add_pool")


POOLS = {"global_mean_pool": "mean", "global_add_pool": "add"}


def pool_functions() -> tuple:
    """PyG's pooling functions, when the library is loaded (torch.fx keeps their calls whole)."""
    glob = sys.modules.get("torch_geometric.nn.pool.glob")
    names = (*POOLS, "global_max_pool")
    return () if glob is None else tuple(getattr(glob, n) for n in names if hasattr(glob, n))


def ends_affine(module: nn.Module) -> bool:
    """Whether ``module`` is a PyG layer whose output is fresh zero-mean linear maps of its input
    (``GCNConv``, ``GraphConv``, ``SAGEConv``; not ``GINConv``, which ends in its ``nn``)."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}
    return bool(names & {CONV + "gcn_conv.GCNConv", CONV + "graph_conv.GraphConv",
                         CONV + "sage_conv.SAGEConv"})


class GeometricFeatures(nn.Module):
    """``x (V, F)`` of a PyG model's ``forward(x, edge_index, ...)``, read from the packed graphs
    ``(1, V, 3V + F)`` (``stax.message_passing``)."""

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        return parts(packed)[3]


class GlobalPool(nn.Module):
    """``global_{mean,add}_pool(h, batch)``: each graph's nodes pooled, ``(1, V, C)`` (graphs
    first, rows past their number zero)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


@register(GeometricFeatures)
def _features(module: GeometricFeatures, ctx: Context) -> stax.Layer:
    return stax.GeometricFeatures()


@register(GlobalPool)
def _pool(module: GlobalPool, ctx: Context) -> stax.Layer:
    return stax.MessagePassing(f"pool_{module.kind}", [], name=f"global_{module.kind}_pool")


def _linear(lin: nn.Module, ctx: Context, bias: torch.Tensor | None = None,
            glorot: bool = False) -> tuple[stax.Layer, dict]:
    """The Dense layer of PyG's ``Linear`` ``lin`` (``bias``: a bias of the layer's own, as
    GCNConv's) and its hyper-parameters; ``glorot``: GCNConv's init (module doc)."""
    fan_in, fan_out = lin.weight.shape[1], lin.weight.shape[0]
    if isinstance(lin.weight, nn.parameter.UninitializedParameter) or fan_in <= 0:
        raise UnsupportedLayerError("lazy in_channels (-1): give the layer its in_channels, or "
                                    "run the model once before converting it")
    bias = lin.bias if bias is None else bias
    kw = ctx.affine(fan_in, lin.weight, bias)
    hyper = dict(ctx.hyper)
    o = ctx.options
    if glorot and o.init == "torch":
        if o.explicit(o.W_std, ctx.name) is None:
            kw["W_std"] = hyper["W_std"] = (2 * fan_in / (fan_in + fan_out)) ** 0.5
        if bias is not None and o.explicit(o.b_std, ctx.name) is None:
            kw["b_std"] = hyper["b_std"] = 0.0
        ctx.init_checks = ()
    ctx.hyper = hyper
    return stax.Dense(fan_in, fan_out, **kw), hyper


def _dense_names(prefix: str, bias: str | None) -> dict:
    return {"weight": f"{prefix}weight"} | ({"bias": bias} if bias else {})


def _weighted(ctx: Context) -> bool:
    return bool((ctx.call or {}).get("weighted"))


@register_by_name(CONV + "gcn_conv.GCNConv")
def _gcn(module, ctx: Context) -> stax.Layer:
    if module.aggr != "add":
        raise UnsupportedLayerError(f"GCNConv(aggr={module.aggr!r}): only aggr='add' has a rule")
    dense, _ = _linear(module.lin, ctx, module.bias, glorot=True)
    weighted = _weighted(ctx)  # PyG's improved=True fills self-loops with 2 given edge weights
    options = {"weighted": weighted, "self_loops": bool(module.add_self_loops),
               "fill": 2.0 if module.improved and weighted else 1.0}
    kind = "gcn" if module.normalize else "add"
    names = _dense_names("lin.", "bias" if module.bias is not None else None)
    return stax.MessagePassing(kind, [Branch(dense, names, True)], options, "GCNConv")


def _aggregation(module, name: str) -> str:
    aggr = module.aggr if isinstance(module.aggr, str) else None
    if aggr not in ("add", "sum", "mean"):
        raise UnsupportedLayerError(f"{name}(aggr={module.aggr!r}): only 'mean' and 'add' "
                                    f"('sum') aggregations have a kernel rule")
    return "mean" if aggr == "mean" else "add"


def _with_root(module, ctx: Context, rel: str, root: str | None, name: str,
               weighted: bool) -> stax.Layer:
    """``rel(aggregate(x)) + root(x)`` of GraphConv and SAGEConv."""
    kind = _aggregation(module, name)
    rel_lin = getattr(module, rel)
    dense, hyper = _linear(rel_lin, ctx)
    branches = [Branch(dense, _dense_names(f"{rel}.", f"{rel}.bias" if rel_lin.bias is not None
                                           else None), True)]
    described = {f"{rel}.{k}": v for k, v in hyper.items()}
    if root is not None:
        root_dense, root_hyper = _linear(getattr(module, root), ctx)
        branches.append(Branch(root_dense, _dense_names(f"{root}.", None), False))
        described |= {f"{root}.{k}": v for k, v in root_hyper.items()}
    ctx.hyper = described
    return stax.MessagePassing(kind, branches, {"weighted": weighted}, name)


@register_by_name(CONV + "graph_conv.GraphConv")
def _graph_conv(module, ctx: Context) -> stax.Layer:
    return _with_root(module, ctx, "lin_rel", "lin_root", "GraphConv", _weighted(ctx))


@register_by_name(CONV + "sage_conv.SAGEConv")
def _sage(module, ctx: Context) -> stax.Layer:
    if module.normalize or module.project:
        raise UnsupportedLayerError("SAGEConv(normalize=True) or (project=True) has no kernel "
                                    "rule; use normalize=False and project=False")
    return _with_root(module, ctx, "lin_l", "lin_r" if module.root_weight else None, "SAGEConv",
                      False)


def _inner(network: nn.Module, ctx: Context) -> tuple[stax.Layer, tuple]:
    """GINConv's ``nn``, an ``nn.Sequential`` of registered modules, as one serial layer, and its
    params' names."""
    if not isinstance(network, nn.Sequential):
        raise UnsupportedLayerError(f"GINConv's nn is a {type(network).__name__}; write it as an "
                                    f"nn.Sequential of supported modules (Linear, ReLU, ...)")
    layers, names = [], []
    for i, m in enumerate(network):
        converter = find_converter(m)
        if converter is None:
            raise UnsupportedLayerError(f"GINConv's nn.{i} ({type(m).__name__}) has no kernel "
                                        f"rule in ntbridge")
        sub = Context(f"{ctx.name}.nn.{i}", ctx.index, ctx.options)
        layers.append(converter(m, sub))
        names.append({p: f"nn.{i}.{p}" for p, _ in m.named_parameters()})
    return stax.serial(*layers), tuple(names)


@register_by_name(CONV + "gin_conv.GINConv")
def _gin(module, ctx: Context) -> stax.Layer:
    if module.aggr != "add":
        raise UnsupportedLayerError(f"GINConv(aggr={module.aggr!r}): only aggr='add' has a rule")
    layer, names = _inner(module.nn, ctx)
    trained = isinstance(module.eps, nn.Parameter)
    refusal = ("GINConv(train_eps=True): the NTK of a trained eps has no rule here; use "
               "train_eps=False, or ntbridge.empirical_ntk") if trained else None
    return stax.MessagePassing("gin", [Branch(layer, names, True)],
                               {"eps": float(module.eps.detach()[0])}, "GINConv", refusal)


@register_by_name(CONV + "message_passing.MessagePassing")
def _other(module, ctx: Context) -> stax.Layer:
    attention = " (attention over neighbours has no kernel rule here)" if "GAT" in type(
        module).__name__ else ""
    raise UnsupportedLayerError(
        f"{type(module).__name__}{attention}: of PyTorch Geometric's layers, {SUPPORTED} have "
        f"kernel rules; build the model from them.")
