import atexit
import gc
import os
import shutil
import tempfile

# Under pytest-xdist each worker keeps to cores of its own (dealt round robin), before JAX or
# ntbridge start: with `-n 2` on 2 cores, XLA then compiles a worker's programs on its one core
# (ntbridge.devices.usable_cores) instead of two threads contending with the other worker's.
if (_worker := os.environ.get("PYTEST_XDIST_WORKER")) and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if _workers <= len(_cores):
        os.sched_setaffinity(0, _cores[int(_worker.removeprefix("gw")) % _workers::_workers])

import jax
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

# Four CPU devices for the batching tests (must be set before JAX's backend starts).
jax.config.update("jax_num_cpu_devices", 4)
# One torch thread: the Monte-Carlo references run many small ops, which threads only slow down.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# Property-based tests: a fast, deterministic default profile for CI; HYPOTHESIS_PROFILE=long for a
# longer local search.
settings.register_profile("ci", max_examples=6, deadline=None, derandomize=True, print_blob=True,
                          phases=[Phase.explicit, Phase.generate],  # report, do not shrink
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ntbridge's compilation cache: a fresh directory per test run (xdist's workers inherit it), not the
# user's cache, removed when the process that made it exits.
if "NTBRIDGE_CACHE_DIR" not in os.environ:
    os.environ["NTBRIDGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="ntbridge-test-cache-")
    atexit.register(shutil.rmtree, os.environ["NTBRIDGE_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(items):
    """The slow tests first (a stable sort): under ``-n 2`` the long ones then run side by side
    from the start, instead of leaving one worker alone with the last of them at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    """An xdist worker frees its compiled programs and collects its garbage before it reports the
    session finished: the master then shuts it down, and a worker still collecting 5 s later (each
    collection runs JAX's gc callback, which frees XLA's buffers) is sent SIGINT by execnet, whose
    KeyboardInterrupt inside that callback pytest reports as an unraisable exception."""
    if hasattr(session.config, "workerinput"):
        from ntbridge import programs

        programs.clear()
        jax.clear_caches()
        gc.collect()
