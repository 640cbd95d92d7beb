"""torch.fx: models that are not ``nn.Sequential``, traced into a DAG of converted nodes.

:mod:`.tracer` traces ``forward`` (registered modules kept whole); :mod:`.nodes` walks the traced
nodes, each claimed by the first of the registered node patterns (:mod:`.patterns`) that
recognises it; the spellings those patterns read are :mod:`.equivalents`' (functional calls as
module instances), :mod:`.calls`' (attention modules' calls), :mod:`.positions`' (positional
embeddings, learned tokens), :mod:`.adjacency`'s (aggregation over adjacency matrices) and
:mod:`.time_major`'s (sequences ``(T, N, d)``), :mod:`.norms`' (hand-written RMSNorm), :mod:`.chunks`' (``h.chunk(n, d)[i]``); :mod:`.independence` says which branches of sums
and products are uncorrelated.
"""

from . import patterns  # noqa: F401 (registers the node patterns)
from .nodes import fx_nodes

__all__ = ["fx_nodes"]
