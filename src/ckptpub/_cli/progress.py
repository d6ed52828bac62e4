"""A progress bar on stderr for hashing that takes more than a moment.

Shown only when stderr is a terminal, and only once the work has run for
``DELAY_SECONDS``, so scripts, pipes and fast runs see no noise. Drawing is best
effort: a terminal that goes away stops the bar, never the hashing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

DELAY_SECONDS = 0.5
REDRAW_SECONDS = 0.1
WIDTH = 30


class ProgressBar:
    """Callable as ``on_progress(done_bytes, total_bytes)``; ``close()`` clears the line."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr  # None when stderr was closed at start-up
        self.enabled = self.stream is not None and self.stream.isatty()
        self.started = time.monotonic()
        self.last_draw = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.started < DELAY_SECONDS or (now - self.last_draw < REDRAW_SECONDS and done < total):
            return
        self.last_draw = now
        fraction = done / total if total else 1.0
        filled = int(fraction * WIDTH)
        rate = done / max(now - self.started, 1e-9) / 1e9
        self.drawn = self._write(
            f"\r{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {fraction:4.0%} "
            f"{done / 1e9:.2f}/{total / 1e9:.2f} GB {rate:.1f} GB/s"
        )

    def close(self) -> None:
        if self.drawn:
            self._write("\r\x1b[K")

    def _write(self, text: str) -> bool:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop drawing, keep working
            self.enabled = False
            return False
        return True
