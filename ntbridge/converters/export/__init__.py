"""torch.export -> core ATen -> JAX: any model's forward as a pure JAX function, for the empirical
kernels of models no converter covers.

:mod:`.translator` exports a model and evaluates its ATen program with the JAX functions of
:mod:`.aten` (and :mod:`.aten_layers`); :mod:`.steps` splits the program into the steps the
``"structured"`` strategy runs; :mod:`.translation` picks, per request, the converted
:class:`~..graph.Graph` or the cached :class:`~.translation.Translation`.
"""
