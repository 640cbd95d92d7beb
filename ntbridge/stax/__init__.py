"""ntbridge's infinite-width kernel core: stax-style layers ``(init_fn, apply_fn, kernel_fn)``.

Layers use torch's layout (channels first) and torch's semantics; ``kernel_fn`` maps the
:class:`Kernel` of a layer's inputs to that of its outputs (Neural Tangents' mathematics).
"""

from .activations import (ABRelu, Abs, Cos, Erf, Gelu, LeakyRelu, Numerical, Relu, Sign, Sin,
                          ab_relu_rule, elementwise)
from .combinators import INPUT, dag, serial
from .dropout import Dropout
from .kernel import Kernel, input_kernel
from .layers import PARAMETERIZATIONS, Dense, Identity, Layer
from .normalization import BatchNorm, LayerNorm

__all__ = ["ABRelu", "INPUT", "Dense", "dag", "Identity", "Kernel", "Layer", "PARAMETERIZATIONS", "Relu",
           "ab_relu_rule", "elementwise", "input_kernel", "serial",
           "Abs", "BatchNorm", "Cos", "Dropout", "Erf", "Gelu", "LayerNorm", "LeakyRelu", "Numerical",
           "Sign", "Sin"]
