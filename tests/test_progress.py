"""Progress of long work: shown on a terminal once the work takes a while, never on a pipe unless
asked, a compilation shown as a stage."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

import torch

import ntbridge
from helpers import mlp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One process on a pseudo-terminal: a call under a long delay (nothing shown), then calls that
# compile new programs under no delay (stage and bar shown).
ON_A_TERMINAL = """
import os, sys, torch, ntbridge
model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
os.environ["NTBRIDGE_PROGRESS_DELAY"] = "600"
ntbridge.ntk(model, torch.randn(6, 3), batch_size=3)
sys.stderr.write("<quiet above>")
os.environ["NTBRIDGE_PROGRESS_DELAY"] = "0"
ntbridge.ntk(model, torch.randn(8, 3), batch_size=4)
"""


def _on_a_pty(code: str) -> str:
    """What ``python -c code`` writes to stderr, a 100-column pseudo-terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = dict(os.environ, PYTHONPATH=ROOT)
    process = subprocess.Popen([sys.executable, "-c", code], stderr=slave, env=env,
                               stdout=subprocess.DEVNULL)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert process.wait(timeout=300) == 0, b"".join(chunks).decode()
    return b"".join(chunks).decode()


@pytest.mark.slow
def test_a_terminal_shows_compilation_and_tiles_once_work_takes_a_while():
    quiet, shown = _on_a_pty(ON_A_TERMINAL).split("<quiet above>")
    assert quiet.strip() == ""
    assert "ntbridge: compiling the analytic program (4 x 4 tiles)" in shown
    assert "ntbridge tiles: 100%" in shown and "3/3" in shown  # 3 tiles of the symmetric 2 x 2


def test_a_pipe_shows_nothing_unless_asked(capfd):
    x = torch.randn(6, 3)
    ntbridge.ntk(mlp(3, [16], 1), x, batch_size=2)
    assert capfd.readouterr().err == ""
    ntbridge.ntk(mlp(3, [16], 1), x, batch_size=2, progress=True)
    assert "ntbridge tiles: 100%" in capfd.readouterr().err
