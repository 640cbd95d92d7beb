"""PyTorch Geometric's ``forward(x, edge_index, ...)`` in a traced model: its inputs named as
``Data``'s attributes (``x``, ``edge_index``, ``edge_weight``, ``batch``), the graph inputs read
by PyG layers and pooling functions alone; the stand-ins are :mod:`..geometric`'s."""

from __future__ import annotations

from torch import fx, nn

from ...errors import ConversionError, UnsupportedLayerError
from ..geometric import POOLS, GlobalPool, pool_functions
from .tracer import describe

GRAPH_INPUTS = ("edge_index", "edge_weight", "batch")


def is_geometric(placeholders: list[fx.Node]) -> bool:
    """Whether ``forward`` takes PyG's inputs: an ``edge_index`` after the node features."""
    return any(p.target == "edge_index" for p in placeholders[1:])


def check_inputs(placeholders: list[fx.Node], model_name: str) -> None:
    """ConversionError unless every input after ``x`` is one of :data:`GRAPH_INPUTS`."""
    other = [p.target for p in placeholders[1:] if p.target not in GRAPH_INPUTS]
    if other:
        raise ConversionError(
            f"{model_name}.forward takes {other}: a PyTorch Geometric model's forward takes the "
            f"node features first, then inputs named as Data's attributes among {GRAPH_INPUTS}.")


def geometric_call(node: fx.Node, model: nn.Module, roles: dict[fx.Node, str], index: int):
    """``(name, module, h, origin, call)`` of a node taking a graph input (``roles``: the graph
    inputs' fx nodes and names; ``index``: the node's among the converted ones): a PyG layer's
    call (``call``: whether it passes edge weights), a pooling function's (a :class:`GlobalPool`,
    ``call`` None); None when it takes none; any other use is refused."""
    if node.op == "call_module":
        module = model.get_submodule(node.target)
        where = f"module {index} '{node.target}' ({type(module).__name__})"
    else:
        where = describe(node)
    found = _call(node, roles, where)
    if found is None:
        return None
    stand_in, h, call = found
    return ((node.target, module, h, where, call) if stand_in is None
            else (node.name, stand_in, h, where, None))


def _call(node: fx.Node, roles: dict[fx.Node, str], where: str):
    arguments = [*node.args, *node.kwargs.values()]
    pool = node.op == "call_function" and node.target in pool_functions()
    if not (pool or any(isinstance(a, fx.Node) and a in roles for a in arguments)):
        return None
    h, rest = arguments[0], arguments[1:]
    if not isinstance(h, fx.Node) or h in roles or any(
            isinstance(a, fx.Node) and a not in roles for a in rest):
        raise ConversionError(f"{where} takes the node features first, then graph inputs alone")
    if node.op == "call_module":
        return None, h, {"weighted": any(isinstance(a, fx.Node) and roles.get(a) == "edge_weight"
                                     for a in rest)}
    name = getattr(node.target, "__name__", "")
    if pool and name in POOLS:  # batch=None: each Data is one graph
        return GlobalPool(POOLS[name]), h, None
    if pool:
        raise UnsupportedLayerError(
            f"{where}: {name} has no kernel rule here (MaxPool's numerical rule, stax.maxpool, "
            f"takes windows of fixed size, not each graph's nodes); pool with global_mean_pool "
            f"or global_add_pool, or use ntbridge.empirical_ntk / ntbridge.monte_carlo.")
    used = ", ".join(roles[a] for a in arguments if isinstance(a, fx.Node) and a in roles)
    raise ConversionError(
        f"{where} computes with the graph input {used}; in ntbridge the graphs enter PyTorch "
        f"Geometric models only through their layers (conv(x, edge_index[, edge_weight])) and "
        f"global_mean_pool/global_add_pool(x, batch).")
