"""A real Trainer run with ``PublishCallback(sign=...)``: every checkpoint it saves is signed.

Each checkpoint is checked by the real ``model_signing verify`` CLI and by ``ckptpub verify
--public-key`` (both subprocesses); a stranger's key fails both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from support import signhelpers, tiny_model  # noqa: E402
from support.checkpoints import run_cli  # noqa: E402
from support.runs import checkpoints  # noqa: E402

from ckptpub import PublishCallback  # noqa: E402

pytestmark = pytest.mark.slow  # Trainer runs


def test_every_saved_checkpoint_is_signed(tmp_path: Path, keys: dict) -> None:
    callback = PublishCallback(sign=keys["trainer"].private)
    trainer = tiny_model.make_trainer(str(tmp_path), callbacks=[callback], max_steps=10, save_steps=5)
    trainer.train()
    assert callback.failures == []
    names = checkpoints(tmp_path)
    assert names == ["checkpoint-5", "checkpoint-10"]
    for name in names:
        folder = tmp_path / name
        result = signhelpers.model_signing_verify(folder, keys["trainer"].public)
        assert result.returncode == 0, result.stderr
        ours = run_cli("verify", folder, "--public-key", keys["trainer"].public)
        assert ours.returncode == 0, ours.stdout + ours.stderr
        assert signhelpers.model_signing_verify(folder, keys["stranger"].public).returncode != 0
        assert run_cli("verify", folder, "--public-key", keys["stranger"].public).returncode == 1


def test_the_callback_signs_with_blake3_file_digests(tmp_path: Path, keys: dict) -> None:
    """``PublishCallback(sign=..., sign_hash="blake3")``: model_signing's Python API and ``ckptpub
    verify --public-key`` accept the saved checkpoint; an unknown hash fails before training."""
    import ckptpub

    with pytest.raises(ckptpub.CkptpubError, match="sign_hash: expected one of 'sha256', 'blake3'"):
        PublishCallback(sign=keys["trainer"].private, sign_hash="sha1")
    callback = PublishCallback(sign=keys["trainer"].private, sign_hash="blake3")
    trainer = tiny_model.make_trainer(str(tmp_path), callbacks=[callback], max_steps=5, save_steps=5)
    trainer.train()
    assert callback.failures == []
    folder = tmp_path / "checkpoint-5"
    assert signhelpers.model_signing_api_verify(folder, keys["trainer"].public) is None
    ours = run_cli("verify", folder, "--public-key", keys["trainer"].public)
    assert ours.returncode == 0, ours.stdout + ours.stderr
