"""Inputs that are not one tensor, packed into one for the converted model that reads them: a
graph model's pairs ``(x, adjacency)`` (:func:`~.aggregation.pack`) and PyTorch Geometric's
``Data``/``Batch`` (:func:`~.geometric_inputs.pack_data`); and the check that the inputs are of
the kind the model takes."""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import InputError
from .aggregation import pack
from .geometric_inputs import Selection, is_data, pack_data
from .graph import Graph


def _is_pair(x) -> bool:
    return isinstance(x, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in x)


def packed_inputs(x1, x2, nodes_first: Callable[[], bool]) -> tuple[object, object, bool,
                                                                   Selection | None]:
    """``(x1, x2, pairs, selection)``: the inputs packed, whether they were pairs ``(x,
    adjacency)``, and for PyG inputs where x1 and x2 lie in their packed union (x2 is then None);
    other inputs as they are (other lists are refused as inputs later). ``nodes_first()``: whether
    the model reads pairs' x as ``(N, V, C)`` (asked of pairs only)."""
    if is_data(x1):
        packed, selection = pack_data(x1, x2)
        return packed, None, False, selection
    if is_data(x2):
        raise InputError("x2 is a PyTorch Geometric Data but x1 is not: give both as Data.")
    if not (_is_pair(x1) or _is_pair(x2)):
        return x1, x2, False, None
    first = nodes_first()
    return (pack(x1, "x1", first), None if x2 is None else pack(x2, "x2", first), True, None)


def check_input_kind(graph, pairs: bool, selection: Selection | None) -> None:
    """InputError unless the inputs are pairs ``(x, adjacency)``, or PyG ``Data``, exactly when
    the model (a :class:`Graph`, or a translation) takes them."""
    takes_pairs = isinstance(graph, Graph) and graph.pair_inputs
    takes_data = isinstance(graph, Graph) and graph.geometric_inputs
    if takes_data and selection is None:
        raise InputError("the model's forward takes PyTorch Geometric inputs, forward(x, "
                         "edge_index, ...): pass x1 as a Data (or Batch), and x2 likewise.")
    if selection is not None and not takes_data:
        raise InputError("x1 is a PyTorch Geometric Data, but the model's forward does not take "
                         "(x, edge_index, ...) with PyG layers that ntbridge converts.")
    if takes_pairs and not pairs:
        raise InputError("the model's forward takes node features and each example's graph, "
                         "forward(x, adjacency): pass x1=(x, adjacency) (and x2 likewise).")
    if pairs and not takes_pairs:
        raise InputError("x1 is a pair (x, adjacency), but the model's forward takes one tensor; "
                         "pairs are for graph models of forward(x, adjacency).")
