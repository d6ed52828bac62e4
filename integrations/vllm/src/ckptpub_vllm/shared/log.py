"""The plugin's logger, a child of vLLM's ``vllm`` logger.

Using a ``vllm.*`` name makes the lines appear with vLLM's own format, level and
handlers (``VLLM_LOGGING_LEVEL`` etc.) in every process, with no set-up of our own.
Every line it logs is ``ckptpub.errors.one_line``: a folder, tensor, identity or
adapter name with a newline or a terminal escape in it can neither split a line of
vLLM's log nor reach the terminal raw.
"""

from __future__ import annotations

import logging

from ckptpub.errors import one_line


class _OneLine(logging.Filter):
    """Replaces a record's message by its ``one_line`` text (the arguments already put in)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = one_line(record.getMessage()), None
        return True


logger = logging.getLogger("vllm.ckptpub")
logger.addFilter(_OneLine())
