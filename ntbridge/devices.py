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
# convolutions are slower than XLA's own for the batched convolutions of empirical NTKs
# (benchmarks/run.py, "CPU convolution" row), so ntbridge keeps the other two only.
# It also splits a program's machine code into up to 32 modules that LLVM compiles in parallel; a
# module beyond the cores the process may use only adds its fixed cost. One per core compiles FC,
# Flatten and GAP programs in 0.80-0.93x the time on 2 busy cores, 0.95-0.99x on idle ones, and
# runs them as fast ("codegen split" rows of benchmarks/run.py).
_YNN = "xla_cpu_experimental_ynn_fusion_type"
CPU_COMPILER_OPTIONS = {_YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE",
                        "xla_cpu_parallel_codegen_split_count": str(min(usable_cores(), 32))}

# The options each kind of analytic program takes on top ("vector options" and "diagonal options"
# rows of benchmarks/run.py, against the defaults; FC at N = 1024, Flatten 16x16 at N = 128):
# - kernels of vectors (FC): XLA's older loop emitters. XLA compiles each loop (fusion) on its
#   own, at a fixed cost of 10-30 ms, so compiling dominates a first call; the older emitters
#   compile these programs in 0.57-0.68x the time and run them as fast (1.01-1.04x).
# - same-position covariances of spatial inputs (Flatten heads): the older emitters, and the
#   reductions left to XLA, fused with the loops that make their operands (YNNPACK's reductions
#   need those operands in memory: a dozen more loops). Compile 0.52-0.59x, steady state 0.93x;
#   the older emitters alone run them 1.12-1.19x slower.
# - every pair of positions (global pooling): the defaults; either set runs 1.3-1.4x slower.
_OLDER_EMITTERS = {"xla_cpu_use_fusion_emitters": "False"}  # XLA reads "False", not "false"
PROGRAM_OPTIONS = {
    "default": {},
    "vector": _OLDER_EMITTERS,
    "diagonal": {**_OLDER_EMITTERS, _YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
}

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
