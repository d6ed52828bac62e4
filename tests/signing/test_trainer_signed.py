"""A real Trainer run with ``PublishCallback(sign=...)``: every checkpoint it saves is signed.

Each checkpoint is checked by the real ``model_signing verify`` CLI and by ``ckptpub verify
--public-key`` (both subprocesses); a stranger's key fails both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "callback"))

import cbhelpers  # noqa: E402
import signhelpers  # noqa: E402
from checkpoints import run_cli  # noqa: E402
from support import tiny_model  # noqa: E402

from ckptpub import PublishCallback  # noqa: E402


def test_every_saved_checkpoint_is_signed(tmp_path: Path, keys: dict) -> None:
    callback = PublishCallback(sign=keys["trainer"].private)
    trainer = tiny_model.make_trainer(str(tmp_path), callbacks=[callback], max_steps=10, save_steps=5)
    trainer.train()
    assert callback.failures == []
    names = cbhelpers.checkpoints(tmp_path)
    assert names == ["checkpoint-5", "checkpoint-10"]
    for name in names:
        folder = tmp_path / name
        result = signhelpers.model_signing_verify(folder, keys["trainer"].public)
        assert result.returncode == 0, result.stderr
        ours = run_cli("verify", folder, "--public-key", keys["trainer"].public)
        assert ours.returncode == 0, ours.stdout + ours.stderr
        assert signhelpers.model_signing_verify(folder, keys["stranger"].public).returncode != 0
        assert run_cli("verify", folder, "--public-key", keys["stranger"].public).returncode == 1
