import subprocess
import sys


def test_demo_runs_and_prints_the_width_table():
    out = subprocess.run([sys.executable, "-m", "ntbridge.cli", "demo", "--widths", "32,128",
                          "--seeds", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Analytic NNGP (6, 6)" in out.stdout and "Analytic NTK" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.strip().startswith(("32 |", "128 |"))]
    assert len(rows) == 2


def test_help_and_bad_subcommand():
    assert subprocess.run([sys.executable, "-m", "ntbridge.cli", "--help"],
                          capture_output=True).returncode == 0
    assert subprocess.run([sys.executable, "-m", "ntbridge.cli", "nonsense"],
                          capture_output=True).returncode == 2
