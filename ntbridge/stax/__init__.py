"""ntbridge's infinite-width kernel core: stax-style layers ``(init_fn, apply_fn, kernel_fn)``.

Layers use torch's layout (channels first) and torch's semantics; ``kernel_fn`` maps the
:class:`Kernel` of a layer's inputs to that of its outputs (Neural Tangents' mathematics); a layer
may also declare a random-feature map beside its kernel rule (``Layer.features``, :mod:`.features`).
"""

from .activations import (ABRelu, Abs, Cos, Erf, Exp, Gelu, LeakyRelu, Numerical, RectifiedMonomial,
                          Relu, Sign, Sin, ab_relu_rule, elementwise)
from .attention import CrossAttention, SelfAttention, Stds
from .combinators import (INPUT, FanInConcat, FanInSum, FanOut, Pick, Scale, dag, parallel,
                          serial)
from .conv import Conv
from .dropout import Dropout
from .aggregation import Aggregate, InputAggregate, NodeFeatures, NodesFirstAggregate
from .message_passing import GeometricFeatures, MessagePassing
from .indexing import Chunk, FanInStack, Index, Reduce, Unsqueeze
from .embedding import Embedding, Positions, Row, Token
from .kernel import Kernel, features_last_kernel, input_kernel, sequence_kernel
from .layers import PARAMETERIZATIONS, Dense, Identity, Layer, Outer, with_hyper
from .batchnorm import BatchNorm, ChannelMoments, ChannelScale
from .normalization import LayerNorm, RMSNorm
from .rotary_attention import RotaryAttention
from .piecewise import Piece, Pieces
from .pooling import AdaptiveAvgPool, AdaptiveMaxPool, AvgPool, LPPool1, MaxPool
from .products import FanInProd
from .reshape import Flatten, Unflatten
from .resize import PixelShuffle, PixelUnshuffle, Upsample
from .sequence import SwapLast, TokenMean, TokenSelect
from .sequence_pair import SequencePair, pack_pair
from .softmax_moments import Rule
from .transpose import ConvTranspose

__all__ = ["ab_relu_rule", "ABRelu", "Abs", "AdaptiveAvgPool", "AdaptiveMaxPool", "Aggregate",
           "AvgPool", "BatchNorm", "ChannelMoments", "ChannelScale", "Chunk", "Conv",
           "ConvTranspose", "Cos", "CrossAttention", "dag", "Dense", "Dropout", "elementwise",
           "Embedding", "Erf", "Exp",
           "FanInConcat", "FanInProd", "FanInStack", "FanInSum", "FanOut", "features_last_kernel",
           "Flatten", "Gelu", "GeometricFeatures", "Identity", "Index", "INPUT", "input_kernel",
           "InputAggregate", "Kernel", "Layer", "LayerNorm", "LeakyRelu", "LPPool1", "MaxPool",
           "MessagePassing", "NodeFeatures", "NodesFirstAggregate", "Numerical", "Outer",
           "pack_pair", "parallel", "PARAMETERIZATIONS", "Pick", "Piece", "Pieces",
           "PixelShuffle", "PixelUnshuffle", "Positions", "RectifiedMonomial", "Reduce", "Relu",
           "RMSNorm", "RotaryAttention", "Row", "Rule", "Scale", "SelfAttention",
           "sequence_kernel", "SequencePair", "serial", "Sign", "Sin", "Stds", "SwapLast",
           "Token", "TokenMean", "TokenSelect", "Unflatten", "Unsqueeze", "Upsample",
           "with_hyper"]
