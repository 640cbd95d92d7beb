"""torch <-> JAX hand-off through DLPack, without copies where the memory layout allows it.

* Contiguous, aligned CPU tensors and CUDA tensors on a GPU that JAX sees are shared, not copied,
  in both directions. The DLPack protocol passes the consumer's stream, so pending torch work is
  visible to JAX and JAX results are visible to torch.
* Non-contiguous or misaligned tensors are copied exactly once (by ``.contiguous()`` or by JAX).
* Tensors that require grad are detached here; a kernel's autograd history is carried by
  :class:`Differentiable`, whose backward computes in JAX and hands the gradients back through
  DLPack too.
* float16/bfloat16 are computed in float32 (one copy); float64 needs JAX's x64 mode, which
  :func:`precision` switches on for the duration of an ntbridge call only.

Example:
    >>> t = torch.randn(4, 3)
    >>> a = to_jax(t)
    >>> shares_memory(t, a)
    True
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Protocol, Sequence

import jax
import numpy as np
import torch

from .errors import GradientError, InputError, InputTypeError

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def torch_kernel_dtype(t: torch.Tensor, name: str = "x1") -> torch.dtype:
    """The torch dtype a kernel of the torch tensor ``t`` is computed and returned in: float64 for
    float64 inputs, else float32 (float16 and bfloat16 too); InputTypeError, in ``name``'s terms,
    for anything but a real floating tensor (integer token ids: the pipeline keeps them apart).
    The JAX side's rule, which takes token ids: :func:`ntbridge.stax.kernel.jax_kernel_dtype`."""
    if not isinstance(t, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}; "
                             f"convert it with torch.as_tensor({name}).")
    if t.dtype.is_complex:
        raise InputTypeError(f"{name} is complex ({t.dtype}); kernels take real inputs: pass "
                             f"{name}.real, or its real and imaginary parts as features, "
                             f"torch.view_as_real({name}).flatten(1).")
    if not t.dtype.is_floating_point:
        raise InputTypeError(f"{name} has dtype {t.dtype}; kernel functions need floating-point "
                             f"inputs: pass {name}.float() (or .double() for float64 kernels). "
                             f"Token ids (e.g. for nn.Embedding) have empirical kernels: "
                             f"ntbridge.empirical_ntk(model, {name}).")
    return torch.float64 if t.dtype == torch.float64 else torch.float32


@contextlib.contextmanager
def precision(dtype: torch.dtype) -> Iterator[None]:
    """Run the enclosed JAX work in float64 (x64 mode) if ``dtype`` is float64, and in float32
    (x64 off) otherwise, even where the user turned x64 on globally: a float32 model's kernels
    are float32, at float32's speed.

    The switch is local to this context and thread: the user's global JAX config is untouched.
    """
    with jax.enable_x64(dtype == torch.float64):
        yield


def check_device(t: torch.Tensor, name: str) -> None:
    """InputError unless JAX has a backend for the device of ``t``."""
    if t.device.type == "cpu":
        return
    if t.device.type == "cuda" and any(d.platform == "gpu" for d in jax.devices()):
        return
    raise InputError(f"{name} is on {t.device}, but JAX has no backend for it "
                     f"(JAX devices: {jax.devices()}). Move it with {name}.cpu(), or install "
                     f"JAX's CUDA plugin: pip install 'ntbridge[cuda]'.")


def check_module(model) -> None:
    """InputTypeError unless ``model`` is a ``torch.nn.Module`` (the model every entry point
    takes)."""
    if not isinstance(model, torch.nn.Module):
        raise InputTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}; wrap "
                             f"a function in a module whose forward calls it.")


def check_has_data(tensors: dict[str, torch.Tensor]) -> None:
    """InputError naming the first of a model's tensors (by qualified name) that holds no data:
    one on the ``meta`` device."""
    for name, t in tensors.items():
        if t.is_meta:
            raise InputError(f"the model's {name} is on the meta device, which holds no data to "
                             f"compute with; materialize the model first: "
                             f"model.to_empty(device='cpu'), then load or initialise its weights "
                             f"(e.g. model.load_state_dict(state)).")


def to_jax(t: torch.Tensor, name: str = "tensor") -> jax.Array:
    """A JAX array over the memory of ``t`` (zero-copy when ``t`` is contiguous and aligned).

    Args:
      t: any floating tensor, on the CPU or on a CUDA device JAX sees. float16/bfloat16 become
        float32; float64 must be converted inside :func:`precision` (float64) to stay float64.
      name: the argument's name, for error messages.

    Returns:
      A ``jax.Array`` of the same shape on the matching JAX device.
    """
    check_device(t, name)
    t = t.detach()
    if t.dtype in _LOW_PRECISION:
        t = t.float()
    if not t.is_contiguous():
        t = t.contiguous()
    return jax.dlpack.from_dlpack(t)


def copy_to_jax(t: torch.Tensor, device) -> jax.Array:
    """A copy of ``t`` owned by JAX on ``device``: made from a NumPy view of a tensor in the CPU's
    memory in a dtype NumPy has (one copy), else from :func:`to_jax`'s array over its memory.

    Example:
        >>> copy_to_jax(torch.ones(2, 3), jax.devices()[0]).shape
        (2, 3)
    """
    if t.device.type == "cpu" and t.dtype not in _LOW_PRECISION:
        return jax.device_put(t.detach().numpy(), device, may_alias=False)
    return jax.device_put(to_jax(t), device, may_alias=False)


def to_torch(a: jax.Array) -> torch.Tensor:
    """A torch tensor over the memory of the JAX array ``a`` (zero-copy).

    Example:
        >>> to_torch(jnp.ones((2, 2))).shape
        torch.Size([2, 2])
    """
    return torch.from_dlpack(a)


def describe(a) -> str:
    """The shape, dtype and device of a torch tensor, JAX array or numpy array, for reprs.

    Example:
        >>> describe(torch.zeros(20, 5))
        '(20, 5) float32 cpu'
    """
    if isinstance(a, torch.Tensor):
        device = str(a.device)
    elif isinstance(a, jax.Array):
        device = ",".join(f"{d.platform}:{d.id}" for d in sorted(a.devices(), key=lambda d: d.id))
    else:
        device = "host"
    return f"{tuple(a.shape)} {str(a.dtype).removeprefix('torch.')} {device}"


def shares_memory(t: torch.Tensor, a: jax.Array) -> bool:
    """Whether torch tensor ``t`` and JAX array ``a`` start at the same address (no copy was made)."""
    return t.data_ptr() == a.unsafe_buffer_pointer()


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite. A CPU tensor is checked by numpy, in one thread
    (torch's threaded reductions stall when the cores are busy, e.g. with XLA's threads after a
    program); others by a finite sum, else every entry (the sum may overflow).

    Example:
        >>> all_finite(torch.tensor([1.0, float("inf")]))
        False
    """
    if not t.is_floating_point():
        return True
    if t.device.type == "cpu" and t.dtype != torch.bfloat16:
        return bool(np.isfinite(t.detach().numpy()).all())
    return bool(torch.isfinite(t.sum()) or torch.isfinite(t).all())


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the model's floating parameters and buffers (float32 if it has none)."""
    floats = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    return floats[0].dtype if floats else torch.float32


def abstract(t: torch.Tensor) -> jax.ShapeDtypeStruct:
    """The shape and dtype of ``t`` as JAX sees them (in the current precision), without data.

    Example:
        >>> abstract(torch.ones(2, 3)).shape
        (2, 3)
    """
    dtype = jax.numpy.dtype(str(t.dtype).removeprefix("torch."))
    return jax.ShapeDtypeStruct(tuple(t.shape), jax.dtypes.canonicalize_dtype(dtype))


class Computation(Protocol):
    """What :class:`Differentiable` runs: a kernel's forward (its leaves as torch tensors) and its
    backward (a gradient, or None, per input, from the gradients of the leaves)."""

    def forward(self) -> Sequence[torch.Tensor]: ...

    def backward(self, grads: Sequence[torch.Tensor],
                 needed: Sequence[bool]) -> Sequence[torch.Tensor | None]: ...


class Differentiable(torch.autograd.Function):
    """A kernel computed in JAX, as one node of torch's autograd graph.

    ``Differentiable.apply(computation, *inputs)`` returns ``computation.forward()``'s tensors as
    they are (no copy), with ``inputs`` (the torch tensors the kernel depends on; None allowed) as
    their autograd inputs. Differentiable once: a double backward raises
    :class:`~ntbridge.errors.GradientError`.

    Example:
        >>> (k,) = Differentiable.apply(computation, x1, None)
        >>> k.sum().backward()   # x1.grad from computation.backward
    """

    @staticmethod
    def forward(ctx, computation: Computation, *inputs: torch.Tensor | None):
        ctx.computation, ctx.inputs = computation, inputs  # not saved tensors: a node that can
        # be differentiated again, e.g. ntbridge.kernel's NNGP and NTK one after the other
        # the same memory; detached, so that a caller may write to them (autograd refuses in-place
        # writes to views that a function returns among several outputs)
        return tuple(t.detach() for t in computation.forward())

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        with torch.no_grad():
            result = ctx.computation.backward(grads, ctx.needs_input_grad[1:])
        anchors = [t for t in (*ctx.inputs, *grads) if t is not None and t.requires_grad]
        if torch.is_grad_enabled() and anchors:  # create_graph=True: refuse what would follow
            result = [None if g is None else _Once.apply(g, *anchors) for g in result]
        return (None, *result)


class _Once(torch.autograd.Function):
    """The identity on a gradient, whose own derivative is refused (a kernel's gradient carries no
    history, so a second derivative through it would silently be zero)."""

    @staticmethod
    def forward(ctx, grad: torch.Tensor, *anchors: Any) -> torch.Tensor:
        return grad.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise GradientError("ntbridge kernels are differentiable once: a double backward (a "
                            "gradient of a kernel's gradient, e.g. backward(create_graph=True) "
                            "then backward again) is not supported.")
