"""ntbridge's infinite-width kernel core: stax-style layers ``(init_fn, apply_fn, kernel_fn)``.

Layers use torch's layout (channels first) and torch's semantics; ``kernel_fn`` maps the
:class:`Kernel` of a layer's inputs to that of its outputs (Neural Tangents' mathematics).
"""

from .activations import ABRelu, Relu, ab_relu_rule, elementwise
from .combinators import INPUT, dag, serial
from .conv import Conv
from .kernel import Kernel, input_kernel
from .layers import PARAMETERIZATIONS, Dense, Identity, Layer
from .pooling import AdaptiveAvgPool, AdaptiveMaxPool, AvgPool, MaxPool
from .reshape import Flatten, Unflatten

__all__ = ["ABRelu", "INPUT", "Dense", "dag", "Identity", "Kernel", "Layer", "PARAMETERIZATIONS", "Relu",
           "ab_relu_rule", "elementwise", "input_kernel", "serial",
           "AdaptiveAvgPool", "AdaptiveMaxPool", "AvgPool", "Conv", "Flatten", "MaxPool", "Unflatten"]
