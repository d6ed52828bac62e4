"""Set-up shared by every test folder.

The tests import helpers from two roots, pytest's ``pythonpath`` setting (pyproject.toml): ``tests``,
for the ``support`` package that several folders share (``support.checkpoints``,
``support.vllm_engine_helpers``, ...), and the repository root, for a folder's own helpers by their path
(``tests.hostile.corpus``, ``tests.callback.cbhelpers``). The scripts they start as subprocesses (the
torchrun and accelerate workers, the crash-test trainer, the engine runner, the Trainer run the preload
supervisor follows) import the same helpers, so this exports the same roots in ``PYTHONPATH`` for every
child of the test session, ahead of whatever ``PYTHONPATH`` was already set. A script imports its own
folder's helpers by bare name (its folder is first on its ``sys.path``). Run such a script by hand with,
for example, ``PYTHONPATH=tests python tests/callback/crash_train.py OUT``.
"""

from __future__ import annotations

import os

import pytest

#: PYTHONPATH as it was before the session (None: unset), restored at its end.
_INHERITED = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    inherited = os.environ.get("PYTHONPATH")
    config.stash[_INHERITED] = inherited
    folders = [str(path) for path in config.getini("pythonpath")]
    os.environ["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, [inherited])])


def pytest_unconfigure(config: pytest.Config) -> None:
    if _INHERITED not in config.stash:
        return
    inherited = config.stash[_INHERITED]
    if inherited is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = inherited
