"""Running a command where file permissions apply, also to root (CI runs as root)."""

from __future__ import annotations

import os
import shutil

import pytest


def without_privileges() -> list[str]:
    """A command prefix under which file permissions apply, also to root.

    Root stays root but loses every capability (CAP_DAC_OVERRIDE included), so it can
    still read its own folders, such as a clone in a 0700 temporary directory, while a
    mode-000 file or folder is refused.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file permissions cannot be exercised")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all"]
