"""``ckptpub ls`` and ``ckptpub log`` of a training run uploaded to a bucket, against a real S3 server."""

from __future__ import annotations

import json
from pathlib import Path

from support.checkpoints import model_tensors, run_cli, write_checkpoint

import ckptpub
from ckptpub._filesystem import run_index


def uploaded_run(s3_server, bucket: str, tmp_path: Path) -> tuple[Path, str]:
    """A run of three published steps (its index names a fourth, rotated away), uploaded to the bucket."""
    run = tmp_path / "run"
    for step in (10, 20, 30):
        folder = write_checkpoint(run / f"checkpoint-{step}", model_tensors(seed=step), extra_files=False)
        identity = ckptpub.publish(folder, provenance={"step": step}).identity
        run_index.append(run, step=step, path=f"checkpoint-{step}", identity=identity, time=float(step))
    run_index.append(run, step=5, path="checkpoint-5", identity="blake3:" + "0" * 64, time=5.0)
    return run, s3_server.upload(run, f"s3://{bucket}/runs/demo")


def test_ls_of_a_run_in_a_bucket_lists_what_the_folder_lists(s3_server, bucket, tmp_path):
    run, url = uploaded_run(s3_server, bucket, tmp_path)
    local, remote = run_cli("ls", "--json", run), run_cli("ls", "--json", url)
    assert remote.returncode == local.returncode == 0, remote.stderr
    rows = json.loads(remote.stdout)
    assert rows == json.loads(local.stdout)
    assert [(r["path"], r["status"]) for r in rows] == [
        ("checkpoint-5", "gone"),
        ("checkpoint-10", "ok"),
        ("checkpoint-20", "ok"),
        ("checkpoint-30", "ok"),
    ]
    assert run_cli("log", url).stdout == run_cli("log", run).stdout


def test_a_step_broken_in_the_bucket_is_unusable_and_named(s3_server, bucket, tmp_path):
    _, url = uploaded_run(s3_server, bucket, tmp_path)
    s3_server.client().put_object(Bucket=bucket, Key="runs/demo/checkpoint-20/ckptpub.json", Body=b"{}")
    result = run_cli("ls", url)
    assert result.returncode == 2
    assert "checkpoint-20" in result.stdout
    assert "UNUSABLE" in result.stdout
    assert "checkpoint-20/ckptpub.json" in result.stdout  # the reason, on its own line
