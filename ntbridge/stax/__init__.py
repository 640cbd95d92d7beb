"""ntbridge's infinite-width kernel core: stax-style layers ``(init_fn, apply_fn, kernel_fn)``.

Layers use torch's layout (channels first) and torch's semantics; ``kernel_fn`` maps the
:class:`Kernel` of a layer's inputs to that of its outputs (Neural Tangents' mathematics).
"""

from .activations import (ABRelu, Abs, Cos, Erf, Exp, Gelu, LeakyRelu, Numerical, RectifiedMonomial,
                          Relu, Sign, Sin, ab_relu_rule, elementwise)
from .combinators import INPUT, FanInConcat, FanInSum, FanOut, Scale, dag, parallel, serial
from .conv import Conv
from .dropout import Dropout
from .graph import Aggregate
from .indexing import FanInStack, Index, Reduce, Unsqueeze
from .kernel import Kernel, input_kernel
from .layers import PARAMETERIZATIONS, Dense, Identity, Layer, Outer, with_hyper
from .normalization import BatchNorm, ChannelMoments, LayerNorm
from .piecewise import Piece, Pieces
from .pooling import AdaptiveAvgPool, AdaptiveMaxPool, AvgPool, LPPool1, MaxPool
from .products import FanInProd
from .reshape import Flatten, Unflatten
from .resize import PixelShuffle, PixelUnshuffle, Upsample
from .transpose import ConvTranspose

__all__ = ["ABRelu", "Abs", "AdaptiveAvgPool", "AdaptiveMaxPool", "Aggregate", "AvgPool",
           "BatchNorm", "ChannelMoments", "Conv", "ConvTranspose", "Cos", "Dense", "Dropout", "Erf",
           "Exp", "FanInConcat", "FanInProd", "FanInStack", "FanInSum", "FanOut", "Flatten", "Gelu",
           "Identity", "Index", "INPUT", "Kernel", "Layer", "LayerNorm", "LeakyRelu", "LPPool1",
           "MaxPool",
           "Numerical", "Outer", "PARAMETERIZATIONS", "Piece", "Pieces", "PixelShuffle",
           "PixelUnshuffle", "RectifiedMonomial", "Reduce", "Relu", "Scale", "Sign", "Sin",
           "Unflatten", "Unsqueeze", "Upsample",
           "ab_relu_rule", "dag", "elementwise", "input_kernel", "parallel", "serial",
           "with_hyper"]
