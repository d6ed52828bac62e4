"""Signed publishes of one folder are serialised: a manifest is never left with another publish's signature.

``publish --sign`` writes ``model.sig`` and ``ckptpub.json`` together under the folder's write
lock (``jsonfiles.folder_lock``, a ``flock`` on the folder itself). Shown two ways: a publish
while the lock is held elsewhere writes nothing (deterministic), and concurrent ``ckptpub
publish --sign`` processes with two keys always leave a pair that verifies (real subprocesses).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import signhelpers
from support.checkpoints import flip_byte

import ckptpub
from ckptpub import signing
from ckptpub._filesystem import jsonfiles

TRIALS = 6


def test_a_publish_writes_nothing_while_another_holds_the_folder(
    tmp_path: Path, keys: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    before = sorted(p.name for p in folder.iterdir())
    monkeypatch.setattr(jsonfiles, "LOCK_TIMEOUT_S", 0.5)
    with jsonfiles.folder_lock(str(folder)):  # another process's lock would be the same: flock is per open
        with pytest.raises(ckptpub.CkptpubError, match="another publish has held its write lock"):
            ckptpub.publish(folder, sign=keys["trainer"].private)
        with pytest.raises(ckptpub.CkptpubError, match="another publish has held its write lock"):
            ckptpub.publish(folder)
    assert sorted(p.name for p in folder.iterdir()) == before
    ckptpub.publish(folder, sign=keys["trainer"].private)  # the lock let go: it goes through
    assert signing.check_signature(folder, signing.TrustedKey(keys["trainer"].public)).ok


def test_concurrent_signed_publishes_leave_a_pair_that_verifies(tmp_path: Path, keys: dict) -> None:
    """Two ``publish --sign`` with two keys and manifests that differ (another ``--base``), started
    together, ``TRIALS`` times: the manifest left is always the one the signature left signs."""
    folder = signhelpers.write_signable_checkpoint(tmp_path / "checkpoint")
    for trial in range(TRIALS):
        flip_byte(folder / "logs" / "train.txt", trial)  # new bytes each trial: a new manifest each time
        commands = [
            [sys.executable, "-m", "ckptpub", "publish", str(folder), "--sign", str(keys[name].private)]
            + ["--base", "blake3:" + digit * 64]
            for name, digit in (("trainer", "1"), ("stranger", "2"))
        ]
        publishers = [
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for command in commands
        ]
        for publisher in publishers:
            _, stderr = publisher.communicate(timeout=120)
            assert publisher.returncode == 0, stderr
        verified = [
            name
            for name in ("trainer", "stranger")
            if signing.check_signature(folder, signing.TrustedKey(keys[name].public)).ok
        ]
        assert len(verified) == 1, f"trial {trial}: the signature left signs another manifest"
        assert ckptpub.verify(folder).ok
