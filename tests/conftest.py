import jax
import pytest
import torch

# Four CPU devices for the batching tests (must be set before JAX's backend starts).
jax.config.update("jax_num_cpu_devices", 4)
# One torch thread: the Monte-Carlo references run many small ops, which threads only slow down.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
