"""What ``ckptpub preload`` checks before its first daemon: what no retry could heal is refused at once.

A daemon that cannot start for a reason of the machine or the command line fails
the same way on every retry; the supervisor's back-off would retry it forever. So
before the loop starts (exit 2, one line):

* the daemon command: its template fills (``{folder}`` present; ``{socket_dir}``
  only with ``--socket-dir``) and its program exists and is executable;
* the target is a model, not an adapter (a PEFT adapter is applied by engines on a
  base; the daemon holds bases);
* the daemon's arguments load through a verifying loader (``--load-format
  manifest_cache``, or a plain format it is switched to): a daemon keyed by a manifest's
  identity refuses any other, on every retry (``shared.options.unverified_daemon_load``);
* for the default daemon command, vLLM itself is asked, in a process like a
  daemon's (:mod:`.vllm_probe`): its weight cache imports, the platform can share
  weights with engines, the socket paths fit the AF_UNIX limit.

What only shows when a daemon runs is classified when it exits (:mod:`.failures`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import ckptpub
from ckptpub.cli import UsageError
from ckptpub.integration import base_of, is_adapter

from ..shared.options import LOAD_FORMAT, unverified_daemon_load
from .daemon_process import DEFAULT_COMMAND, build_argv

#: The probe imports torch and vLLM: tens of seconds on a slow machine, never minutes.
PROBE_TIMEOUT_S = 300.0


def check_daemon_command(template: str, extra: list[str], socket_dir: str | None) -> None:
    """Refuse a ``--daemon-cmd`` that cannot start a daemon, whatever the checkpoint."""
    if "{folder}" not in template:
        raise UsageError("--daemon-cmd must contain {folder}")
    try:
        argv = build_argv(template, extra, folder="/", socket_dir=socket_dir, identity="blake3:")
    except ValueError as error:
        raise UsageError(str(error)) from None
    if shutil.which(argv[0]) is None:
        raise UsageError(f"--daemon-cmd: {argv[0]!r} is not a command that can be run here")


def check_daemon_loads_verified(extra: list[str]) -> None:
    """Refuse arguments for ``vllm preload`` with which its daemon would load unverified bytes.

    Read as vLLM reads them (``--load-format X`` or ``--load-format=X``, underscores for
    dashes); an extra config that is not JSON is left for vLLM to refuse.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--model-loader-extra-config")
    known, _ = parser.parse_known_args([_dashed(argument) for argument in extra])
    try:
        extra_config = json.loads(known.model_loader_extra_config or "null")
    except ValueError:
        extra_config = known.model_loader_extra_config
    unverified = unverified_daemon_load(known.load_format, extra_config)
    if unverified is not None:
        raise UsageError(
            f"a weight-cache daemon keyed by a manifest's identity loads only through a verifying loader, "
            f"and {unverified} does not verify; pass --load-format {LOAD_FORMAT} (its options in "
            "--model-loader-extra-config)"
        )


def _dashed(argument: str) -> str:
    """``--load_format=x`` as ``--load-format=x``: vLLM's parser takes either spelling of a flag."""
    if not argument.startswith("--"):
        return argument
    flag, equals, value = argument.partition("=")
    return flag.replace("_", "-") + equals + value


def check_is_a_model(folder: str, manifest: ckptpub.Manifest) -> None:
    """Refuse an adapter as the daemon's model, naming the base to preload instead."""
    if is_adapter(manifest):
        base = base_of(manifest)
        on = f"; preload its base {base}" if base else ""
        raise UsageError(f"{folder} is an adapter, which engines apply on a base model{on}")


def probe_vllm(template: str, socket_dir: str | None) -> None:
    """For the default daemon command, ask vLLM (as a daemon would) whether a daemon can serve here."""
    if template != DEFAULT_COMMAND:
        return
    argv = [sys.executable, "-m", "ckptpub_vllm.preload.vllm_probe", *([socket_dir] if socket_dir else [])]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=dict(os.environ), check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ckptpub.CkptpubError(f"cannot ask vLLM whether a daemon can run here: {error}") from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ckptpub.CkptpubError(f"the daemon's Python cannot run vLLM (exit {done.returncode}): {last}")
    if not answer.get("ok"):
        raise ckptpub.CkptpubError(str(answer.get("reason")))
