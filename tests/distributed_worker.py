"""A worker process for the batching tests: computes one kernel and saves it.

Usage: python distributed_worker.py OUT_PREFIX [--process I --port P --die] [--kernel-file F]

torch is imported after --die's exit: the process that dies pays for JAX's imports only.
"""

import argparse
import os
import sys


def problem():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2))
    x = torch.randn(int(os.environ.get("WORKER_N", "11")), 5, generator=torch.Generator().manual_seed(1))
    return model, x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--process", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--die", action="store_true",
                        help="process 1 exits before its work; the other's wait for it ends when "
                             "its heartbeats have stopped for 2 s (JAX's check)")
    parser.add_argument("--kernel-file", help="write the kernel to this .npy (tile by tile)")
    parser.add_argument("--batch-size", type=int, default=3)
    args = parser.parse_args()
    import jax
    if args.process is not None:
        jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=2,
                                   process_id=args.process, initialization_timeout=60,
                                   heartbeat_timeout_seconds=2 if args.die else 10)
        if args.die and args.process == 1:
            os._exit(3)
    import numpy as np
    import torch

    import ntbridge
    model, x = problem()
    k = ntbridge.ntk(model, x, batch_size=args.batch_size, out=args.kernel_file)
    if args.process is not None:  # the same request again: its barriers and keys are named alike
        assert torch.equal(ntbridge.ntk(model, x, batch_size=args.batch_size), k)
    np.save(f"{args.out}-{jax.process_index()}.npy", k.numpy())
    return 0


if __name__ == "__main__":
    sys.exit(main())
