"""torch.nn.Module -> stax ``Graph``: a registry of converters keyed by module type.

One file per module family (``linear``, ``conv``, ``activations``, ``structure``, ``embedding``,
``attention``, ``encoder``, ``positions``, ``aggregation``...), each registering its converters in
:mod:`.registry`; supporting a new module type is one small function decorated with
:func:`register` (public as ``ntbridge.register_converter``). :func:`convert` reads
``nn.Sequential`` models module by module and traces others with torch.fx (:mod:`.trace`);
:mod:`.export` translates any model's ``torch.export`` program to JAX for its empirical kernels.

This package is the converters' one interface to the rest of ntbridge: :func:`convert` and
:class:`Graph`, and what the request pipeline asks of a model and its inputs: the model an
empirical kernel runs (:func:`empirical_graph`: a :class:`Graph`, or a :class:`Translation`),
the check of token ids (:func:`check_ids`), the packing of paired inputs ``(x, adjacency)``
(:func:`pack`) and of PyTorch Geometric's ``Data`` (:func:`packed_inputs`, :func:`check_input_kind`) and the modules normalising with batch statistics (:func:`batch_statistics`).
"""

from __future__ import annotations

from .aggregation import pack
from .conversion import convert
from .embedding import check_ids
from .export.translation import Translation, empirical_graph
from .families import batch_statistics
from .geometric_inputs import Selection
from .model_inputs import check_input_kind, packed_inputs
from .graph import Graph, Node
from .registry import register

__all__ = ["Graph", "Node", "Selection", "Translation", "batch_statistics", "check_ids",
           "check_input_kind", "convert", "empirical_graph", "pack", "packed_inputs", "register"]
