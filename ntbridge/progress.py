"""What long work shows while it runs: a tqdm bar over tiles or models, a timer over a stage
(compiling a program).

``progress=True`` shows them at once, ``False`` never; the default ``None`` shows them only when
stderr is a terminal, and only once the work has taken ``NTBRIDGE_PROGRESS_DELAY`` seconds
(default 2), so that quick calls print nothing. Both redraw themselves every second: one long step
(a single large tile, a compilation) shows its elapsed time instead of a frozen ``0/1``.

Example:
    >>> with Bar(total=4, desc="ntbridge tiles", unit="tile", progress=None) as bar:
    ...     bar.update(4)
"""

from __future__ import annotations

import os
import sys
import threading

DELAY = 2.0  # seconds of work before the default shows anything
REFRESH = 1.0  # seconds between redraws


def delay() -> float:
    """The seconds of work before a default (``progress=None``) bar appears."""
    return float(os.environ.get("NTBRIDGE_PROGRESS_DELAY", DELAY))


class Bar:
    """A tqdm bar of ``total`` steps (None: a stage, shown as its elapsed time) that redraws itself
    every second from a background thread. Use as a context manager, or call :meth:`close`."""

    def __init__(self, total: int | None, desc: str, unit: str = "it",
                 progress: bool | None = None, leave: bool = True):
        from tqdm.auto import tqdm

        shown = sys.stderr.isatty() if progress is None else progress
        wait = 0.0 if progress else delay()
        form = None if total is not None else "{desc} [{elapsed}]"
        self._bar = tqdm(total=total, desc=desc, unit=unit, disable=not shown, delay=wait,
                         leave=leave, bar_format=form)
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, args=(wait,), daemon=True)
        if shown:
            self._ticker.start()

    def _tick(self, wait: float) -> None:
        if self._stop.wait(wait):
            return
        while not self._stop.is_set():
            self._bar.refresh()
            self._stop.wait(REFRESH)

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def close(self) -> None:
        self._stop.set()
        if self._ticker.is_alive():
            self._ticker.join()
        self._bar.close()

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
