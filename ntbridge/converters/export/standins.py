"""The modules standing for what the analytic route over a ``torch.export`` graph recognises
(:mod:`.analytic`), with their converters: an affine map whose weight is stored ``(in, out)`` and
applied by ``addmm`` (Hugging Face's ``Conv1D``), and a self-attention written out of projections,
head views and a softmax or ``scaled_dot_product_attention`` (:mod:`.heads`).

They hold the model's own parameters under the model's own names (:func:`hold`), so that a node
named ``h.0.attn`` keys them ``h.0.attn.c_attn.weight`` as ``model.named_parameters()`` does, and
the variances of each projection are read by ``Context.affine``, as ``nn.Linear``'s are: that is
the one place where a conversion reads an initialisation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import torch
from torch import nn

from ... import stax
from ...errors import UnsupportedLayerError
from ...stax.attention_rule import Stds
from ...stax.layers import _sample
from ...stax.rotary import rotate
from ..registry import Context, register

_EXACT = jax.lax.Precision.HIGHEST


def hold(root: nn.Module, parameters: dict[str, nn.Parameter]) -> None:
    """Register ``parameters`` (the model's own tensors) in ``root`` at their relative dotted
    names, nested as the model nests them (``{"c_attn.weight": w}`` -> ``root.c_attn.weight``)."""
    for name, p in parameters.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, p)


@dataclasses.dataclass(frozen=True)
class Projection:
    """One affine projection of the features: ``x W^T + b`` (``W`` ``(out, in)``), or ``x W + b``
    for a weight stored ``(in, out)`` (``transposed``); its output features ``lo:hi`` (a fused
    projection's share). ``owner``: the qualified name of the module holding it (for ``W_std``
    mappings and messages); ``weight``, ``bias``: its parameters' names relative to the node."""

    owner: str
    weight: str
    bias: str | None
    transposed: bool
    lo: int
    hi: int

    def matrix(self, tensors: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The ``(out, in)`` weight and the bias of this share, from torch ``tensors``."""
        w = tensors[self.weight]
        w = (w.T if self.transposed else w)[self.lo:self.hi]
        return w, None if self.bias is None else tensors[self.bias][self.lo:self.hi]

    def apply(self, params: dict, x: jax.Array) -> jax.Array:
        w = params[self.weight]
        w = w[:, self.lo:self.hi] if self.transposed else w[self.lo:self.hi].T
        y = jnp.matmul(x, w, precision=_EXACT)
        return y if self.bias is None else y + params[self.bias][self.lo:self.hi]


def _stds(module: nn.Module, projections: tuple[Projection, ...], ctx: Context):
    """``[(W_std, b_std, distribution)]`` of each projection, as ``Context.affine`` reads them
    (the projection's module's qualified name for explicit mappings)."""
    tensors = dict(module.named_parameters())
    out, checks = [], []
    for p in projections:
        w, b = p.matrix(tensors)
        sub = Context(p.owner, ctx.index, ctx.options)
        kw = sub.affine(w.shape[1], w, b)
        checks += [(f"{p.weight}[{p.lo}:{p.hi}] {label}", t, fan_in)
                   for label, t, fan_in in sub.init_checks]
        out.append((kw["W_std"], kw["b_std"], kw["distribution"]))
    ctx.init_checks = tuple(checks)
    return out


class ExportedAffine(nn.Module):
    """``x @ weight + bias`` of a weight stored ``(in, out)`` (Hugging Face's ``Conv1D``), the
    model's parameters held under their own names."""

    def __init__(self, owner: str, weight: nn.Parameter, bias: nn.Parameter | None):
        super().__init__()
        self.owner = owner
        self.weight = weight
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


@register(ExportedAffine)
def _exported_affine(module: ExportedAffine, ctx: Context) -> stax.Layer:
    n_in, n_out = module.weight.shape
    dense = stax.Dense(n_in, n_out, **ctx.affine(n_in, module.weight.T, module.bias))
    flip = lambda params: {**params, "weight": params["weight"].T}

    def init_fn(key, shape):
        out, params = dense.init_fn(key, shape)
        return out, flip(params)

    return dense._replace(init_fn=init_fn, apply_fn=lambda params, x: dense.apply_fn(flip(params), x),
                          structure=None)


class ExportedAttention(nn.Module):
    """Self-attention recognised in an exported graph (:mod:`.heads`): queries, keys and values
    projected from one sequence ``x`` ``(N, T, E)``, ``heads`` query heads of ``head_dim``
    channels sharing ``kv_heads`` heads of keys and values (grouped-query attention), logits
    ``logit_scale * q k^T / sqrt(head_dim)``, the keys each query may see (``allowed``: a
    ``(T, T)`` boolean tensor, None for all; ``padding``: keys whose token id is this one masked,
    the layer then taking ``(x, ids)``), softmax, ``@ v``, the heads merged and projected by
    ``out``; ``frequencies``: queries and keys rotated by rotary position embeddings of these
    frequencies (None: not rotated)."""

    def __init__(self, parameters: dict[str, nn.Parameter], q: Projection, k: Projection,
                 v: Projection, out: Projection, heads: int, kv_heads: int, head_dim: int,
                 allowed: torch.Tensor | None, padding: int | None = None,
                 logit_scale: float = 1.0, frequencies: tuple[float, ...] | None = None):
        super().__init__()
        self.padding, self.logit_scale, self.frequencies = padding, logit_scale, frequencies
        hold(self, parameters)
        self.projections = (q, k, v, out)
        self.heads, self.kv_heads, self.head_dim, self.allowed = heads, kv_heads, head_dim, allowed

    def __repr__(self) -> str:
        """One line: the projections' modules, the heads and whether a mask applies."""
        owners = ", ".join(dict.fromkeys(p.owner for p in self.projections))
        mask = "" if self.allowed is None else ", masked"
        groups = f", kv_heads={self.kv_heads}" if self.kv_heads != self.heads else ""
        scale = "" if self.logit_scale == 1.0 else f", logit_scale={self.logit_scale:.6g}"
        rotary = "" if self.frequencies is None else ", rotary"
        return (f"ExportedAttention({owners}: heads={self.heads}{groups}, "
                f"head_dim={self.head_dim}{scale}{rotary}{mask})")


def _forward(module: ExportedAttention, mask: jax.Array | None):
    """The attention's ``apply_fn(params, x)`` (params keyed by their names in the module)."""
    q, k, v, out = module.projections
    h, g, d = module.heads, module.kv_heads, module.head_dim

    def apply_fn(params, x):
        x, ids = x if module.padding is not None else (x, None)
        split = lambda p, n: p.apply(params, x).reshape(*x.shape[:-1], n, d)
        qs, ks, vs = split(q, h), split(k, g), split(v, g)
        if module.frequencies is not None:
            qs, ks = (rotate(a, jnp.asarray(module.frequencies)) for a in (qs, ks))
        ks, vs = (jnp.repeat(a, h // g, axis=-2) for a in (ks, vs))
        logits = jnp.einsum("nthd,nshd->nhts", qs, ks, precision=_EXACT) * (
            module.logit_scale / d ** 0.5)
        if mask is not None:
            logits = logits + mask
        if ids is not None:
            logits = jnp.where((ids == module.padding)[:, None, None, :], -jnp.inf, logits)
        z = jnp.einsum("nhts,nshd->nthd", jax.nn.softmax(logits, axis=-1), vs, precision=_EXACT)
        return out.apply(params, z.reshape(*x.shape[:-1], h * d))

    return apply_fn


def _init(module: ExportedAttention, stds: list):
    """The attention's ``init_fn``: each parameter drawn at its projection's variances (a fused
    projection's shares drawn alike: its entries share the module's init)."""
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    first = {}
    for p, (W, b, dist) in zip(module.projections, stds):
        fan_in = shapes[p.weight][0 if p.transposed else 1]
        first.setdefault(p.weight, (W / fan_in ** 0.5, dist))
        if p.bias is not None:
            first.setdefault(p.bias, (b, dist))

    def init_fn(key, shape):
        keys = jax.random.split(key, len(first))
        shape = shape if module.padding is None else shape[0]
        return tuple(shape), {name: _sample(kk, shapes[name], std, dist)
                              for kk, (name, (std, dist)) in zip(keys, first.items())}

    return init_fn


@register(ExportedAttention)
def _exported_attention(module: ExportedAttention, ctx: Context) -> stax.Layer:
    e = module.heads * module.head_dim
    stds = _stds(module, module.projections, ctx)
    biases = [b for _, b, _ in stds]  # each projection's, None where it has no bias (Qwen2's out)
    W = tuple(w for w, _, _ in stds)
    ctx.hyper = {"W_std": W, "b_std": None if biases == [None] * 4 else tuple(biases)}
    mask = None if module.allowed is None else jnp.asarray(
        torch.where(module.allowed, 0.0, -torch.inf).double().numpy())
    base = stax.SelfAttention(e, module.heads, Stds(*W, *biases),
                              parameterization=ctx.parameterization, mask=mask,
                              linear_scaling=ctx.options.attention == "linear",
                              rule=stax.Rule(points=ctx.options.attention_points),
                              padding_id=module.padding, logit_scale=module.logit_scale,
                              frequencies=module.frequencies)
    if ctx.options.attention == "linear":
        raise UnsupportedLayerError("attention='linear' (Neural Tangents' tied variant) is not "
                                    "this model's attention; use the default 'softmax'.")
    return base._replace(init_fn=_init(module, stds), apply_fn=_forward(module, mask),
                         structure=None)
