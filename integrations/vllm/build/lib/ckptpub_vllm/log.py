"""The plugin's logger, a child of vLLM's ``vllm`` logger.

Using a ``vllm.*`` name makes the lines appear with vLLM's own format, level and
handlers (``VLLM_LOGGING_LEVEL`` etc.) in every process, with no set-up of our own.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm.ckptpub")
