"""Tiles exchanged between the processes of a ``jax.distributed`` run.

Each process computes every ``process_count``-th tile; the tiles then travel through the
distributed key-value store, with bounded waits: a process that dies makes the others raise
:class:`~ntbridge.errors.ProcessError` instead of hanging.
"""

from __future__ import annotations

import io
import os

import jax
import numpy as np
import torch

from ..errors import ProcessError

PEER_TIMEOUT_S = float(os.environ.get("NTBRIDGE_PEER_TIMEOUT", "600"))
CALLS = [0]  # requests so far: the same count on every process of an SPMD program


def _client():
    from jax._src import distributed  # the key-value store and barriers of jax.distributed
    return distributed.global_state.client


def barrier(name: str) -> None:
    """Wait for every process to reach ``name`` (in this request); no-op in a single process."""
    if jax.process_count() == 1:
        return
    try:
        _client().wait_at_barrier(f"ntbridge-{CALLS[0]}-{name}", int(PEER_TIMEOUT_S * 1000))
    except Exception as e:  # the client raises its own error types
        raise ProcessError(f"another process did not reach '{name}' within {PEER_TIMEOUT_S:.0f} s "
                           f"(it failed or is much slower): {e}") from None


def exchange(tiles: list[tuple[int, int]], computed: dict, put) -> None:
    """Publish this process's ``computed`` tiles (``{(i, j): [torch leaves]}``) and ``put(i, j,
    leaves)`` every other process's tile of ``tiles`` (tile ``n`` belongs to process
    ``n % process_count``)."""
    client, pid, count = _client(), jax.process_index(), jax.process_count()
    key = lambda i, j: f"ntbridge-{CALLS[0]}-tile-{i}-{j}"
    for (i, j), leaves in computed.items():
        buffer = io.BytesIO()
        np.savez(buffer, *[leaf.cpu().numpy() for leaf in leaves])
        client.key_value_set_bytes(key(i, j), buffer.getvalue())
    for n, (i, j) in enumerate(tiles):
        if n % count == pid:
            continue
        try:
            data = client.blocking_key_value_get_bytes(key(i, j), int(PEER_TIMEOUT_S * 1000))
        except Exception as e:
            raise ProcessError(f"process {n % count} did not deliver its tiles within "
                               f"{PEER_TIMEOUT_S:.0f} s (it failed or is much slower): {e}") from None
        arrays = np.load(io.BytesIO(data))
        put(i, j, [torch.from_numpy(arrays[f"arr_{k}"]) for k in range(len(arrays.files))])
    barrier("exchanged")
