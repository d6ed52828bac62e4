"""Settings people give ckptpub besides a function's arguments: environment variables and durations.

Every ``CKPTPUB_*`` variable that ckptpub or its vLLM plugin reads is listed in
``VARIABLES``, and each kind of value has one parser, so a setting means the same to
the CLI, the plugin in an engine or daemon, and the ``ckptpub preload`` supervisor:

* a flag (``flag``, ``env_flag``) is ``1``/``true``/``yes``/``on`` or
  ``0``/``false``/``no``/``off`` (any case, spaces around ignored; unset or empty is
  off); anything else is refused rather than guessed, so ``CKPTPUB_DEBUG=false``
  never turns tracebacks on and a typo never turns a fail-closed check off;
* a duration (``seconds``) is a finite number of seconds above 0 and at most
  ``MAX_SECONDS``: NaN, infinities, zero and negative values are refused, so a poll
  never spins and a timeout never overflows a ``threading`` or ``timedelta`` call.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from .errors import CkptpubError

DEBUG_ENV = "CKPTPUB_DEBUG"
REQUIRE_MANIFEST_ENV = "CKPTPUB_REQUIRE_MANIFEST"
PUBLIC_KEY_ENV = "CKPTPUB_PUBLIC_KEY"
CERTIFICATE_CHAIN_ENV = "CKPTPUB_CERTIFICATE_CHAIN"
PRELOAD_STATE_DIR_ENV = "CKPTPUB_PRELOAD_STATE_DIR"
PRELOAD_IDENTITY_ENV = "CKPTPUB_PRELOAD_IDENTITY"
PRELOAD_TAKEOVER_ENV = "CKPTPUB_PRELOAD_TAKEOVER"
REFUSAL_FILE_ENV = "CKPTPUB_REFUSAL_FILE"
EXPECT_IDENTITY_ENV = "CKPTPUB_EXPECT_IDENTITY"

#: Every environment variable ckptpub, ckptpub-vllm and ckptpub-sglang read, and what it does.
VARIABLES: Mapping[str, str] = {
    DEBUG_ENV: "a flag: a failed ckptpub command shows its traceback instead of its one-line error",
    REQUIRE_MANIFEST_ENV: "a flag: engines and weight-cache daemons refuse folders without ckptpub.json",
    PUBLIC_KEY_ENV: "a PEM public key: engines, daemons and ckptpub preload serve only what it signed",
    CERTIFICATE_CHAIN_ENV: "PEM files (os.pathsep-separated): as CKPTPUB_PUBLIC_KEY, for certificates",
    PRELOAD_STATE_DIR_ENV: "ckptpub preload's state folder (default ~/.local/state/ckptpub/preload)",
    PRELOAD_IDENTITY_ENV: "set by ckptpub preload in each daemon it starts: the identity it loads",
    PRELOAD_TAKEOVER_ENV: "set to 1 by ckptpub preload in a daemon that takes over a socket path: it waits",
    REFUSAL_FILE_ENV: "set by the plugin where an engine starts: the file its workers relay a refusal to",
    EXPECT_IDENTITY_ENV: "an identity: SGLang engines and weight-cache daemons serve only that checkpoint",
}

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
#: The longest duration accepted: 115 days, below what ``threading`` waits and ``timedelta`` take.
MAX_SECONDS = 1e7


def flag(text: str, what: str) -> bool:
    """``text`` as a flag (see the module docstring); ``CkptpubError`` naming ``what`` otherwise.

    >>> flag(" On", "CKPTPUB_DEBUG"), flag("", "CKPTPUB_DEBUG")
    (True, False)
    """
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS or not word:
        return False
    raise CkptpubError(
        f"{what}: {text!r} is neither on ({'/'.join(TRUE_WORDS)}) nor off ({'/'.join(FALSE_WORDS)})"
    )


def env_flag(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """The flag in the environment variable ``name`` (one of ``VARIABLES``); unset is off."""
    return flag(environ.get(name, ""), name)


def seconds(value: object, what: str | None = None) -> float:
    """``value`` (a number, or its text) as a duration in seconds; ``CkptpubError`` naming ``what`` otherwise.

    Without ``what`` the message is the problem alone (an argparse ``type`` adds the option's name).

    >>> seconds("2.5", "--interval")
    2.5
    """
    try:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not 0 < number <= MAX_SECONDS:  # False for NaN too
        problem = f"{value!r} is not a positive number of seconds (at most {MAX_SECONDS:.0f})"
        raise CkptpubError(problem if what is None else f"{what}: {problem}")
    return number
