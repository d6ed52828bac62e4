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

It also keeps the fast tier fast. A test that starts a vLLM engine, a Trainer or torchrun is marked
``slow`` (pyproject.toml registers the marker); ``make test-fast`` runs the others with
``--fast-limit``, which fails the run, naming them, if any unmarked test took longer than that
(set-up and tear-down included): a new heavy test without the marker cannot slip in unseen.
"""

from __future__ import annotations

import os

import pytest

#: PYTHONPATH as it was before the session (None: unset), restored at its end.
_INHERITED = pytest.StashKey[str | None]()
#: Seconds each test not marked ``slow`` took so far, set-up, call and tear-down together.
_FAST_SECONDS: dict[str, float] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast-limit",
        type=float,
        metavar="SECONDS",
        help="fail the run if a test not marked slow took longer than SECONDS (the fast tier's guard)",
    )


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


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slow" not in report.keywords:
        _FAST_SECONDS[report.nodeid] = _FAST_SECONDS.get(report.nodeid, 0.0) + report.duration


def _over_limit(config: pytest.Config) -> list[tuple[str, float]]:
    """The unmarked tests that took longer than ``--fast-limit``, slowest first."""
    limit = config.getoption("fast_limit")
    if limit is None:
        return []
    return sorted(((n, s) for n, s in _FAST_SECONDS.items() if s > limit), key=lambda item: -item[1])


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _over_limit(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    over = _over_limit(config)
    if over:
        limit = config.getoption("fast_limit")
        terminalreporter.section(f"tests not marked slow that took over {limit:g} s")
        for nodeid, seconds in over:
            terminalreporter.line(f"{seconds:7.1f} s  {nodeid}")
        terminalreporter.line(
            "mark each slow if it starts a vLLM engine, a Trainer or torchrun, else speed it up"
        )
