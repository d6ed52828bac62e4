"""The plugin's logger, a child of SGLang's ``sglang`` logger, every line ``one_line``.

A ``sglang.*`` name puts the lines in SGLang's own format and handlers in every
process. A folder, tensor or identity with a newline or a terminal escape in it can
neither split a line of the log nor reach the terminal raw.
"""

from __future__ import annotations

import logging

from ckptpub.errors import one_line


class _OneLine(logging.Filter):
    """Replaces a record's message by its ``one_line`` text (the arguments already put in)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = one_line(record.getMessage()), None
        return True


logger = logging.getLogger("sglang.ckptpub")
logger.addFilter(_OneLine())
