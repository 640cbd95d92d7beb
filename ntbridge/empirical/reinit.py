"""Fresh initialisations of a torch model by its modules' own ``reset_parameters``: the samples of
``monte_carlo`` for models without a converter (whose parameters no ``init_fn`` can draw).

Sample ``s`` of seed ``seed`` is drawn under ``torch.manual_seed(sample_seed(seed, s))``
(``numpy.random.SeedSequence([seed, s])``'s first 32-bit state): each module with parameters of its
own, submodules before the modules containing them (as at construction: reversed
``model.modules()`` order), calls ``reset_parameters()`` (``_reset_parameters()`` for torch's
``nn.MultiheadAttention``, which has no public one). The global RNG state is restored afterwards.

Example:
    >>> check_resettable(model)
    >>> reinitialise(copy, seed=0, sample=3)        # copy: a deep copy of model, changed in place
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..compat import reset_function
from ..converters.reuse import copies
from ..errors import UnsupportedLayerError


def sample_seed(seed: int, *sample: int) -> int:
    """The torch seed of sample ``sample`` of ``seed`` (see the module doc); ``sample`` may have
    several parts (e.g. a width and a seed index), each draw independent of the others."""
    return int(np.random.SeedSequence([seed, *sample]).generate_state(1)[0])


def _owners(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules with parameters of their own, submodules first."""
    return [(name, m) for name, m in reversed(list(model.named_modules()))
            if next(m.parameters(recurse=False), None) is not None]


def check_resettable(model: nn.Module) -> None:
    """UnsupportedLayerError naming the first module with parameters but no ``reset_parameters``."""
    for name, module in reversed(_owners(model)):
        if reset_function(module) is None:
            kind = type(module).__name__
            raise UnsupportedLayerError(
                f"{f'module {name!r}' if name else 'the model'} ({kind}) has parameters but no "
                f"reset_parameters(), so "
                f"monte_carlo cannot draw fresh initialisations of this model (it has no "
                f"converter). Define {kind}.reset_parameters() (re-initialising its parameters in "
                f"place), or average ntbridge.empirical_ntk over models you initialise yourself.")


def reinitialise(model: nn.Module, seed: int, sample: int) -> None:
    """Draw sample ``sample`` of ``seed``'s initialisations into ``model``, in place (module doc).
    The layers of an ``nn.TransformerEncoder``/``Decoder`` that hold copies of one layer, as torch
    builds them, get copies of the first layer's fresh weights."""
    devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
    stacks = [m for m in model.modules() if isinstance(m, (nn.TransformerEncoder,
                                                            nn.TransformerDecoder))
              and copies(m.layers) == {True}]
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(sample_seed(seed, sample))
        for _, module in _owners(model):
            reset_function(module)()
        for stack in stacks:
            for layer in stack.layers[1:]:
                layer.load_state_dict(stack.layers[0].state_dict())
