"""ntbridge's infinite-width kernel core: stax-style layers ``(init_fn, apply_fn, kernel_fn)``.

Layers use torch's layout (channels first) and torch's semantics; ``kernel_fn`` maps the
:class:`Kernel` of a layer's inputs to that of its outputs (Neural Tangents' mathematics).
"""

from .activations import ABRelu, Relu, ab_relu_rule, elementwise
from .combinators import INPUT, FanInConcat, FanInSum, FanOut, Scale, dag, parallel, serial
from .kernel import Kernel, input_kernel
from .conv import Conv
from .layers import PARAMETERIZATIONS, Dense, Identity, Layer, Outer
from .pooling import AdaptiveAvgPool, AdaptiveMaxPool, AvgPool, MaxPool
from .reshape import Flatten, Unflatten

__all__ = ["ABRelu", "AdaptiveAvgPool", "AdaptiveMaxPool", "AvgPool", "Conv", "Flatten", "MaxPool",
           "Unflatten", "Dense", "FanInConcat", "FanInSum", "FanOut", "INPUT", "Identity", "Kernel",
           "Layer", "Outer", "PARAMETERIZATIONS", "Relu", "Scale", "ab_relu_rule", "dag",
           "elementwise", "input_kernel", "parallel", "serial"]
