"""A progress bar on stderr for hashing that takes more than a moment.

Shown only when stderr is a terminal, and only once the work has run for
``DELAY_SECONDS``, so scripts, pipes and fast runs see no noise.
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see records.py)
if TYPE_CHECKING:
    from typing import TextIO

DELAY_SECONDS = 0.5
REDRAW_SECONDS = 0.1
WIDTH = 30


class ProgressBar:
    """Callable as ``on_progress(done_bytes, total_bytes)``; ``close()`` clears the line."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
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
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {fraction:4.0%} "
            f"{done / 1e9:.2f}/{total / 1e9:.2f} GB {rate:.1f} GB/s"
        )
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
