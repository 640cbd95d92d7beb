"""Converters of pooling: ``nn.AvgPool{n}d`` (``divisor_override`` too: ``1`` is sum pooling),
``nn.AdaptiveAvgPool{n}d``, ``nn.LPPool{n}d`` (``norm_type=1``), ``nn.MaxPool{n}d``,
``nn.AdaptiveMaxPool{n}d`` for n = 1, 2, 3."""

from torch import nn

from .. import stax
from ..errors import UnsupportedLayerError
from ..stax.conv import as_tuple
from .registry import Context, register

AVG = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
ADAPTIVE_AVG = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)
MAX = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
ADAPTIVE_MAX = (nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
LP = (nn.LPPool1d, nn.LPPool2d, nn.LPPool3d)


def _ndim(module: nn.Module, family: tuple[type, ...]) -> int:
    return next(i + 1 for i, cls in enumerate(family) if isinstance(module, cls))


def _output_size(module: nn.Module, ndim: int) -> tuple[int | None, ...]:
    size = module.output_size
    return (size,) * ndim if size is None or isinstance(size, int) else tuple(size)


def _no_indices(module: nn.Module) -> None:
    if module.return_indices:
        raise UnsupportedLayerError("return_indices=True returns a tuple; only a tensor output "
                                    "is supported (set return_indices=False)")


def _avg(module: nn.AvgPool2d, ctx: Context) -> stax.Layer:
    ndim = _ndim(module, AVG)
    return stax.AvgPool(as_tuple(module.kernel_size, ndim), module.stride, module.padding,
                        module.ceil_mode, module.count_include_pad,
                        getattr(module, "divisor_override", None))


def _lp(module: nn.LPPool2d, ctx: Context) -> stax.Layer:
    if module.norm_type != 1:
        raise UnsupportedLayerError(
            f"norm_type={module.norm_type}: the p-th root of a window's sum of p-th powers has no "
            f"closed-form kernel (only p = 1, a sum pooling, is linear); use nn.AvgPool with "
            f"divisor_override=1 for sums, ntbridge.empirical_ntk or ntbridge.monte_carlo.")
    ndim = _ndim(module, LP)
    return stax.LPPool1(as_tuple(module.kernel_size, ndim), module.stride, module.ceil_mode)


def _adaptive_avg(module: nn.AdaptiveAvgPool2d, ctx: Context) -> stax.Layer:
    return stax.AdaptiveAvgPool(_output_size(module, _ndim(module, ADAPTIVE_AVG)))


def _max(module: nn.MaxPool2d, ctx: Context) -> stax.Layer:
    _no_indices(module)
    ndim = _ndim(module, MAX)
    return stax.MaxPool(as_tuple(module.kernel_size, ndim), module.stride, module.padding,
                        module.dilation, module.ceil_mode)


def _adaptive_max(module: nn.AdaptiveMaxPool2d, ctx: Context) -> stax.Layer:
    _no_indices(module)
    return stax.AdaptiveMaxPool(_output_size(module, _ndim(module, ADAPTIVE_MAX)))


for _family, _converter in ((AVG, _avg), (ADAPTIVE_AVG, _adaptive_avg), (LP, _lp), (MAX, _max),
                            (ADAPTIVE_MAX, _adaptive_max)):
    for _cls in _family:
        register(_cls)(_converter)
