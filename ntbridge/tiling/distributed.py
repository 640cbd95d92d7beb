"""Tiles exchanged between the processes of a ``jax.distributed`` run.

Each process computes every ``process_count``-th tile; the tiles then travel through the
distributed key-value store, with bounded waits: a process that dies makes the others raise
:class:`~ntbridge.errors.ProcessError` instead of hanging. Keys and barriers are named after the
request (:func:`request_name`), so processes running different requests time out instead of
mixing tiles; each request deletes its keys before its last barrier, so the same request may run
again.

JAX has no public API for its key-value store: :func:`ntbridge.compat.distributed_client` reads
its private client. :func:`client` checks that it is still there with the methods used here and
otherwise raises ProcessError naming the JAX version (``tests/test_compat.py`` fails loudly if it
moves).
"""

from __future__ import annotations

import hashlib
import io
import os

import jax
import numpy as np
import torch

from ..compat import CLIENT_METHODS, distributed_client
from ..errors import ProcessError

PEER_TIMEOUT_S = float(os.environ.get("NTBRIDGE_PEER_TIMEOUT", "600"))


def client():
    """The key-value store and barriers of the running ``jax.distributed`` job."""
    found = distributed_client()
    missing = [m for m in CLIENT_METHODS if not hasattr(found, m)]
    if found is None or missing:
        raise ProcessError(f"JAX {jax.__version__} no longer offers jax.distributed's key-value "
                           f"store where ntbridge reads it (missing: {missing or ['client']}); "
                           f"run one process, or a JAX release ntbridge supports.")
    return found


def request_name(*parts) -> str:
    """A name for one request's keys and barriers, the same on every process that runs it:
    a digest of ``parts`` (kinds, shapes, tile sizes: values every process shares)."""
    return "ntbridge-" + hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def barrier(request: str, stage: str) -> None:
    """Wait for every process to reach ``stage`` of ``request``; no-op in a single process."""
    if jax.process_count() == 1:
        return
    try:
        client().wait_at_barrier(f"{request}-{stage}", int(PEER_TIMEOUT_S * 1000))
    except ProcessError:
        raise
    except Exception as e:  # the client raises its own error types
        raise ProcessError(f"another process did not reach '{stage}' within {PEER_TIMEOUT_S:.0f} s "
                           f"(it failed, is much slower, or runs another request): {e}") from None


def exchange(request: str, tiles: list[tuple[int, int]], computed: dict, put) -> None:
    """Publish this process's ``computed`` tiles (``{(i, j): [torch leaves]}``) and ``put(i, j,
    leaves)`` every other process's tile of ``tiles`` (tile ``n`` belongs to process
    ``n % process_count``)."""
    store, pid, count = client(), jax.process_index(), jax.process_count()
    key = lambda i, j: f"{request}-tile-{i}-{j}"
    for (i, j), leaves in computed.items():
        buffer = io.BytesIO()
        np.savez(buffer, *[leaf.cpu().numpy() for leaf in leaves])
        store.key_value_set_bytes(key(i, j), buffer.getvalue())
    for n, (i, j) in enumerate(tiles):
        if n % count == pid:
            continue
        try:
            data = store.blocking_key_value_get_bytes(key(i, j), int(PEER_TIMEOUT_S * 1000))
        except Exception as e:
            raise ProcessError(f"process {n % count} did not deliver its tiles within "
                               f"{PEER_TIMEOUT_S:.0f} s (it failed, is much slower, or runs "
                               f"another request): {e}") from None
        arrays = np.load(io.BytesIO(data))
        put(i, j, [torch.from_numpy(arrays[f"arr_{k}"]) for k in range(len(arrays.files))])
    barrier(request, "exchanged")
    for i, j in computed:
        store.key_value_delete(key(i, j))
    barrier(request, "cleared")
