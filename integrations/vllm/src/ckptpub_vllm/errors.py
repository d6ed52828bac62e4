"""The one error the plugin raises when it will not serve a checkpoint.

A subclass of ``RuntimeError`` so vLLM treats it like any other load failure; its
message is one line that names the folder and the first offending tensor or file,
so it is readable at the bottom of vLLM's engine-failure log and in scripts.
"""

from __future__ import annotations


class RefusedError(RuntimeError):
    """The checkpoint does not match its manifest (or has none where one is required)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
