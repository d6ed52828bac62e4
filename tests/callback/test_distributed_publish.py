"""Publishing and verifying spread over real ranks (gloo processes on this machine).

The distributed publish must write the manifest a single process writes (every
entry, the identity), each rank must hash its own share, a flipped byte in a file a
non-zero rank hashes must be found, and a rank that stalls or dies must make the
publish fail within the timeout, with no manifest left, never a hang.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from support.checkpoints import copy_checkpoint, flip_byte, run_cli, tensor_range, write_checkpoint
from support.runs import free_port, run_group, torchrun

import ckptpub
from ckptpub._hashing.distributed import assign_files
from ckptpub._hashing.engine import Span

HERE = Path(__file__).resolve().parent
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def entries(folder: Path) -> dict:
    """The manifest without its creation time: what must be equal however it was hashed."""
    manifest = json.loads((folder / ckptpub.MANIFEST_NAME).read_bytes())
    del manifest["provenance"]["created"]
    return manifest


def our_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if "ckptpub" in p.name)


def rank_exits(stderr: str) -> dict[int, int]:
    """Each rank's exit code, from torchrun's failure summary (none was stopped by the other)."""
    found = re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\s*exitcode\s*: (-?\d+)", stderr)
    return {int(rank): int(code) for rank, code in found}


def rank_reports(out: Path, ranks: int) -> list[dict]:
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(ranks)]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "source", shards=4)


def test_files_go_whole_to_ranks_balanced_by_bytes():
    sizes = {"a": [50, 30], "b": [40], "c": [30], "d": [10, 10]}  # spans of each file, in order
    spans = [Span(f"/mnt/{name}", 0, size, name) for name, parts in sizes.items() for size in parts]
    owners = assign_files(spans, 2)
    by_file = {name: {o for s, o in zip(spans, owners, strict=True) if s.name == name} for name in sizes}
    assert all(len(ranks) == 1 for ranks in by_file.values()), by_file  # a file is never split
    loads = [sum(s.size for s, o in zip(spans, owners, strict=True) if o == rank) for rank in (0, 1)]
    assert loads == [80, 90]  # largest first to the least-loaded rank: a to 0; b, c, then d to 1
    assert assign_files(spans, 2) == owners  # every rank computes the same assignment
    assert set(assign_files(spans, 8)) == {0, 1, 2, 3}  # more ranks than files: some hash nothing


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_publish_under_torchrun_writes_the_single_process_manifest(checkpoint, tmp_path, ranks):
    alone = copy_checkpoint(checkpoint, tmp_path / "alone")
    spread = copy_checkpoint(checkpoint, tmp_path / "spread")
    ckptpub.publish(alone)
    r = run_group(torchrun(ranks, "-m", "ckptpub", "publish", str(spread)), timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert entries(spread) == entries(alone)
    # rank 0 prints the identity and its note; the other ranks print nothing
    assert r.stdout.split() == [ckptpub.read_manifest(alone).identity]
    assert r.stderr.count("ckptpub: published") == 1


@pytest.mark.slow
def test_a_signed_publish_under_torchrun_verifies_with_the_public_key(checkpoint, tmp_path):
    """Rank 0 signs; every rank computes the SHA-256 of the files it hashes for that signature."""
    from support import signhelpers

    key = signhelpers.make_key(tmp_path / "keys", "trainer")
    # "-m --": torchrun would take --sign for an abbreviation of its own --signals-to-handle
    command = torchrun(2, "-m", "--", "ckptpub", "publish", str(checkpoint), "--sign", str(key.private))
    r = run_group(command, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (checkpoint / "model.sig").is_file()
    verified = run_cli("verify", checkpoint, "--public-key", key.public)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    spread = run_group(
        torchrun(2, "-m", "ckptpub", "verify", str(checkpoint), "--public-key", str(key.public)),
        timeout=120,
        env=ENV,
    )
    assert spread.returncode == 0, spread.stderr[-3000:]
    assert spread.stdout.count("model.sig") == 0, spread.stdout  # the signature is not listed as content
    assert len([line for line in spread.stderr.splitlines() if ": OK, " in line]) == 1  # rank 0 says it
    alone = copy_checkpoint(checkpoint, tmp_path / "alone")
    for ours in ("model.sig", ckptpub.MANIFEST_NAME):
        (alone / ours).unlink()
    ckptpub.publish(alone)
    assert entries(checkpoint) == entries(alone)


@pytest.mark.slow
def test_a_blake3_signed_publish_under_torchrun(checkpoint, tmp_path):
    """``--sign-hash blake3`` on 2 ranks: each rank computes the whole-file BLAKE3 of the files it
    hashes, and rank 0's signature is what model_signing's Python API accepts."""
    from support import signhelpers

    key = signhelpers.make_key(tmp_path / "keys", "trainer")
    signing = ["--sign", str(key.private), "--sign-hash", "blake3"]
    command = torchrun(2, "-m", "--", "ckptpub", "publish", str(checkpoint), *signing)
    r = run_group(command, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert signhelpers.model_signing_api_verify(checkpoint, key.public) is None
    verified = run_cli("verify", checkpoint, "--public-key", key.public)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.slow
def test_each_rank_hashes_its_own_share(checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = torchrun(2, str(HERE / "dist_publish.py"), str(checkpoint), str(out))
    r = run_group(script, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    reports = rank_reports(out, 2)
    total = sum(f.size for f in ckptpub.read_manifest(checkpoint).files)
    assert [rep["identity"] for rep in reports] == [ckptpub.read_manifest(checkpoint).identity] * 2
    assert all(rep["hashed_bytes"] > 0 for rep in reports), reports
    assert sum(rep["hashed_bytes"] for rep in reports) == total


def linked_view(source: Path, view: Path) -> Path:
    """The same files under another path (hard links: the very inodes), as a node mounting the one
    shared file system elsewhere sees them."""
    for path in sorted(source.rglob("*")):
        target = view / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
    return view


@pytest.mark.slow
def test_ranks_may_see_the_folder_at_different_paths_but_not_different_folders(checkpoint, tmp_path):
    """Each node mounts the storage where it likes; a rank that sees other files refuses with the rest."""
    linked_view(checkpoint, tmp_path / "view-0")
    linked_view(checkpoint, tmp_path / "view-1")
    out = tmp_path / "out"
    out.mkdir()
    script = torchrun(2, str(HERE / "dist_publish.py"), str(tmp_path / "view-{rank}"), str(out))
    r = run_group(script, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert entries(tmp_path / "view-0")["identity"] == ckptpub.build_manifest(checkpoint).identity
    total = sum(f.size for f in ckptpub.read_manifest(tmp_path / "view-0").files)
    assert sum(report["hashed_bytes"] for report in rank_reports(out, 2)) == total  # the one storage: shared
    assert our_files(tmp_path / "view-1") == []  # only rank 0 writes

    (tmp_path / "view-0" / ckptpub.MANIFEST_NAME).unlink()
    (tmp_path / "view-1" / "notes.txt").write_text("only rank 1 sees this file")
    r = run_group(script, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    for report in rank_reports(out, 2):
        assert "the ranks see different checkpoints" in report["error"], report
    assert our_files(tmp_path / "view-0") == []


def refused_on_every_rank(stderr: str) -> bool:
    """Exit 2 on both ranks, but for one that torchrun stopped (SIGTERM) as it was exiting anyway,
    once the other had exited 2: the two raise the same error at the same exchange, then meet so
    that rank 0 has said why before either exits."""
    exits = rank_exits(stderr)
    return sorted(exits) == [0, 1] and set(exits.values()) <= {2, -15} and 2 in exits.values()


def per_rank_folder(command: str, *args: str) -> list[str]:
    """``torchrun`` running ``ckptpub COMMAND ARGS... FOLDER-<rank>``: each rank its own folder, as
    node-local copies are (``--no-python``: the command runs through ``sh``, which appends the rank)."""
    program = f'exec "{sys.executable}" -m ckptpub {command} "$@" "$0-$RANK"'
    return torchrun(2, "--no-python", "sh", "-c", program, *args)


@pytest.mark.slow
def test_ranks_whose_copies_hold_other_bytes_refuse_to_publish_or_verify(checkpoint, tmp_path):
    """Copies with the same names, headers and sizes but one byte changed in a file that rank 1 would
    hash (a stale replica): the ranks read other files, so each hashes every file itself and they
    compare; publish writes nothing and verify gives no verdict, on both ranks, said once."""
    manifest = ckptpub.publish(checkpoint)
    files = [Span(f.path, 0, f.size, f.path) for f in manifest.files]
    owners = dict(zip((f.path for f in manifest.files), assign_files(files, 2), strict=True))
    tensor = next(t for t in manifest.tensors if owners[t.file] == 1)
    for rank in (0, 1):
        copy_checkpoint(checkpoint, tmp_path / f"copy-{rank}")
    start, _ = tensor_range(tmp_path / "copy-0" / tensor.file, tensor.name)
    flip_byte(tmp_path / "copy-0" / tensor.file, start)  # rank 0's copy: a byte rank 0 would never read
    verified = run_group(per_rank_folder("verify", str(tmp_path / "copy")), timeout=120, env=ENV)
    assert refused_on_every_rank(verified.stderr), verified.stderr[-3000:]
    errors = [line for line in verified.stderr.splitlines() if line.startswith("ckptpub: error:")]
    assert errors == [
        f"ckptpub: error: rank 1 read other bytes than rank 0 in {tensor.file}: tensor {tensor.name!r}: "
        "the ranks' copies of the folder differ; publish or verify where every rank reads the same files"
    ], verified.stderr[-3000:]
    assert run_cli("verify", tmp_path / "copy-0").returncode == 1  # what a single process says
    for rank in (0, 1):
        (tmp_path / f"copy-{rank}" / ckptpub.MANIFEST_NAME).unlink()
    published = run_group(per_rank_folder("publish", str(tmp_path / "copy")), timeout=120, env=ENV)
    assert refused_on_every_rank(published.stderr), published.stderr[-3000:]
    assert "rank 1 read other bytes than rank 0" in published.stderr
    assert our_files(tmp_path / "copy-0") == []


@pytest.mark.slow
def test_ranks_whose_copies_hold_the_same_bytes_publish_the_single_process_manifest(checkpoint, tmp_path):
    """Node-local copies that agree: every rank hashes every file itself (said in one warning), and
    the manifest is the one a single process writes; verify agrees."""
    for rank in (0, 1):
        copy_checkpoint(checkpoint, tmp_path / f"copy-{rank}")
    published = run_group(per_rank_folder("publish", str(tmp_path / "copy")), timeout=120, env=ENV)
    assert published.returncode == 0, published.stderr[-3000:]
    assert published.stderr.count("every rank hashes every file itself") == 1, published.stderr
    assert entries(tmp_path / "copy-0")["identity"] == ckptpub.build_manifest(checkpoint).identity
    shutil.copy(tmp_path / "copy-0" / ckptpub.MANIFEST_NAME, tmp_path / "copy-1")
    verified = run_group(per_rank_folder("verify", str(tmp_path / "copy")), timeout=120, env=ENV)
    assert verified.returncode == 0, verified.stderr[-3000:]


@pytest.mark.slow
def test_verify_under_torchrun_finds_a_byte_flipped_in_a_file_rank_1_hashes(checkpoint):
    ckptpub.publish(checkpoint)
    manifest = ckptpub.read_manifest(checkpoint)
    files = [Span(f.path, 0, f.size, f.path) for f in manifest.files]
    owners = dict(zip((f.path for f in manifest.files), assign_files(files, 2), strict=True))
    tensor = next(t for t in manifest.tensors if owners[t.file] == 1)
    start, _ = tensor_range(checkpoint / tensor.file, tensor.name)
    r = run_group(torchrun(2, "-m", "ckptpub", "verify", str(checkpoint)), timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    flip_byte(checkpoint / tensor.file, start)
    r = run_group(torchrun(2, "-m", "ckptpub", "verify", str(checkpoint)), timeout=120, env=ENV)
    assert r.returncode == 1, r.stderr[-3000:]  # torchrun: a rank exited 1
    assert rank_exits(r.stderr) == {0: 1, 1: 1}, r.stderr[-3000:]  # the same verdict on both ranks
    failed = [line for line in r.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1, r.stdout  # printed once, by rank 0
    assert tensor.name in failed[0]


@pytest.mark.slow
def test_unusable_input_under_torchrun_is_one_error_line_and_exit_2_on_every_rank(checkpoint):
    r = run_group(torchrun(2, "-m", "ckptpub", "verify", str(checkpoint)), timeout=120, env=ENV)
    assert r.returncode != 0
    assert rank_exits(r.stderr) == {0: 2, 1: 2}, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("ckptpub: error:")]
    assert len(errors) == 1, r.stderr[-3000:]  # said once, by rank 0
    assert "no ckptpub.json" in errors[0]


@pytest.mark.slow
def test_a_stalled_rank_fails_the_publish_within_the_timeout(checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = torchrun(2, str(HERE / "dist_publish.py"), str(checkpoint), str(out), "--timeout", "3")
    r = run_group([*script, "--stall", "8"], timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    writer, stalled = rank_reports(out, 2)
    assert "timed out" in writer["error"].lower(), writer
    assert "error" in stalled, stalled  # the late rank fails too instead of waiting forever
    assert our_files(checkpoint) == []  # no manifest, no temporary file


@pytest.mark.slow
def test_a_killed_rank_fails_the_publish_at_once(checkpoint, tmp_path):
    """Started by hand with torchrun's environment: torchrun itself stops every rank when one dies."""
    import subprocess

    out = tmp_path / "out"
    out.mkdir()
    port = str(free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, str(HERE / "dist_publish.py"), str(checkpoint), str(out), "--kill"],
            env=dict(
                ENV, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port
            ),
        )
        for r in (0, 1)
    ]
    codes = [rank.wait(timeout=120) for rank in ranks]
    assert codes[1] == -9
    assert codes[0] == 0
    (writer,) = rank_reports(out, 1)
    assert "distributed hashing failed" in writer["error"], writer
    assert our_files(checkpoint) == []
