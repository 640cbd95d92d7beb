"""Platforms, devices, free memory and the XLA options of ntbridge's programs.

Example:
    >>> platform_of(jnp.ones(3))
    'cpu'
    >>> compiler_options("gpu")
    {}
"""

from __future__ import annotations

import os

import jax
import torch


def platform_of(x: jax.Array | jax.ShapeDtypeStruct | torch.Tensor) -> str:
    """The platform ("cpu", "gpu", ...) of the devices holding ``x``, a JAX array or a torch
    tensor; JAX's default platform for an abstract value without a sharding."""
    if isinstance(x, torch.Tensor):
        return "gpu" if x.device.type == "cuda" else "cpu"
    sharding = getattr(x, "sharding", None)
    return jax.default_backend() if sharding is None else next(iter(sharding.device_set)).platform


def free_bytes(device) -> int:
    """Free memory of ``device``: its allocator's limit, or the host's available memory."""
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def usable_cores() -> int:
    """The number of CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# XLA's CPU compiler hands matrix products, reductions and 2D convolutions to YNNPACK; its
# convolutions are slower for the batched convolutions of empirical NTKs, so ntbridge keeps the
# other two only. Machine code goes into one LLVM module per usable core (XLA's default is 32, and
# each module beyond the cores only adds its fixed cost). Measurements: benchmarks/README.md.
_YNN = "xla_cpu_experimental_ynn_fusion_type"
CPU_COMPILER_OPTIONS = {_YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE",
                        "xla_cpu_parallel_codegen_split_count": str(min(usable_cores(), 32))}

# The options each kind of analytic program takes on top (benchmarks/README.md):
# - kernels of vectors (FC): XLA's older loop emitters, which compile a program's many small
#   fusions faster and run them as fast;
# - same-position covariances of spatial inputs (Flatten heads): the older emitters, and the
#   reductions left to XLA, fused with the loops that make their operands;
# - every pair of positions (global pooling): the defaults, faster there.
# - small programs, of any kind (see small_program): the older emitters, LLVM's optimisation
#   level 1 and none of its expensive passes. Such a program runs in milliseconds and compiling it
#   is the call's time: these compile in much less time and run a little slower.
_OLDER_EMITTERS = {"xla_cpu_use_fusion_emitters": "False"}  # XLA reads "False", not "false"
PROGRAM_OPTIONS = {
    "default": {},
    "vector": _OLDER_EMITTERS,
    "diagonal": {**_OLDER_EMITTERS, _YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    "small": {**_OLDER_EMITTERS, "xla_backend_optimization_level": "1",
              "xla_llvm_disable_expensive_passes": "True"},
}
SMALL_WORK = 2 ** 16  # pairs of examples in a program times the elements of an example


def small_program(pairs: int, example_size: int) -> bool:
    """Whether a program of the kernel of ``pairs`` pairs of examples of ``example_size`` elements
    each is small enough for the "small" options: ``pairs * example_size`` at most
    :data:`SMALL_WORK`. (Weights' products go to libraries whatever the options, so a large
    model's empirical program of a few examples qualifies too.)

    Example:
        >>> small_program(6 * 6, 3 * 8 * 8), small_program(32 * 32, 3 * 8 * 8)
        (True, False)
    """
    return pairs * example_size <= SMALL_WORK

_REJECTED: set[str] = set()  # platforms whose XLA rejected the options (they are experimental)


def compiler_options(platform: str, kind: str = "default") -> dict[str, str]:
    """The XLA options of ntbridge's programs of ``kind`` (a key of :data:`PROGRAM_OPTIONS`) on
    ``platform``: :data:`CPU_COMPILER_OPTIONS` and the kind's on CPUs, unless their XLA rejected
    them (:func:`reject_options`); none elsewhere."""
    if platform != "cpu" or platform in _REJECTED:
        return {}
    return {**CPU_COMPILER_OPTIONS, **PROGRAM_OPTIONS[kind]}


def reject_options(platform: str) -> None:
    """Compile ``platform``'s programs without options from now on (its XLA does not know them)."""
    _REJECTED.add(platform)
