"""Inputs that are not one tensor, packed into one for the converted model that reads them: a
graph model's pairs ``(x, adjacency)`` (:func:`~.aggregation.pack`), a decoder's two sequences
``(x, memory)`` (:func:`~.sequence_pair.pack_sequences`) and PyTorch Geometric's
``Data``/``Batch`` (:func:`~.geometric_inputs.pack_data`); and the check that the inputs are of
the kind the model takes."""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import InputError
from .aggregation import pack
from .geometric_inputs import Selection, is_data, pack_data
from .graph import Graph
from .sequence_pair import pack_sequences, sequence_features


_ONE_TENSOR = ("x1 is a pair, but the model's forward takes one tensor; pairs are for models of "
               "forward(x, adjacency) or forward(x, memory).")


def _is_pair(x) -> bool:
    return isinstance(x, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in x)


def packed_inputs(x1, x2, graph: Callable[[], Graph]) -> tuple[object, object, bool,
                                                             Selection | None]:
    """``(x1, x2, pairs, selection)``: the inputs packed, whether they were pairs (a graph model's
    ``(x, adjacency)``, or two sequences ``(x, memory)``), and for PyG inputs where x1 and x2 lie
    in their packed union (x2 is then None); other inputs as they are (other lists are refused as
    inputs later). ``graph()``: the converted model, asked of pairs only (how it reads them)."""
    if is_data(x1):
        packed, selection = pack_data(x1, x2)
        return packed, None, False, selection
    if is_data(x2):
        raise InputError("x2 is a PyTorch Geometric Data but x1 is not: give both as Data.")
    if not (_is_pair(x1) or _is_pair(x2)):
        return x1, x2, False, None
    model = graph()
    if (features := sequence_features(model)) is not None:
        pack_one = lambda x, name: pack_sequences(x, name, features)
    elif model.pair_inputs:
        pack_one = lambda x, name: pack(x, name, model.nodes_first)
    else:
        raise InputError(_ONE_TENSOR)
    return pack_one(x1, "x1"), None if x2 is None else pack_one(x2, "x2"), True, None


def check_input_kind(graph, pairs: bool, selection: Selection | None) -> None:
    """InputError unless the inputs are pairs (``(x, adjacency)``, ``(x, memory)``), or PyG
    ``Data``, exactly when the model (a :class:`Graph`, or a translation) takes them."""
    takes_sequences = isinstance(graph, Graph) and sequence_features(graph) is not None
    takes_pairs = isinstance(graph, Graph) and graph.pair_inputs
    takes_data = isinstance(graph, Graph) and graph.geometric_inputs
    if takes_sequences:
        if not pairs:
            raise InputError("the model's forward takes two sequences, forward(x, memory): pass "
                             "x1=(x, memory) (and x2 likewise).")
        return
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
        raise InputError(_ONE_TENSOR)
