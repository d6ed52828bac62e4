"""Models in the Hugging Face cache, published, verified, shown and compared by their hub id.

The cache is built offline (``hf_cache``) and resolved by huggingface_hub itself; the
CLI runs as a real subprocess with ``HF_HOME`` pointing at it and ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from support.checkpoints import flip_byte, model_tensors, run_cli, tensor_range, write_checkpoint
from support.hf_cache import cache_dir, cache_model, cache_state

import ckptpub
from ckptpub._format.canonical import canonical_json

pytest.importorskip("huggingface_hub")

REPO = "acme/tiny-qwen3"


def cli(home: Path, *args: object, cwd: Path | None = None):
    return run_cli(*args, cwd=cwd, env={"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"})


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An HF_HOME whose cache holds acme/tiny-qwen3 at one commit (refs/main), unpublished."""
    source = write_checkpoint(tmp_path / "download", shards=2)
    cache_model(tmp_path / "hf", REPO, source)
    return tmp_path / "hf"


def snapshot_of(home: Path, revision: str | None = None) -> Path:
    """The snapshot huggingface_hub itself resolves the id to, offline."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(REPO, revision=revision, cache_dir=cache_dir(home), local_files_only=True))


def blob_holding(snapshot: Path, tensor: str) -> tuple[Path, int]:
    """The blob a snapshot's shard holding ``tensor`` links to, and the tensor's first byte in it."""
    for shard in sorted(snapshot.glob("*.safetensors")):
        blob = Path(os.path.realpath(shard))
        try:
            return blob, tensor_range(blob, tensor)[0]
        except KeyError:
            continue
    raise KeyError(tensor)


def test_publish_verify_show_by_hub_id_leave_every_blob_and_link_unchanged(home: Path) -> None:
    before = cache_state(home)
    published = cli(home, "publish", REPO)
    assert published.returncode == 0, published.stderr
    identity = published.stdout.strip()
    snapshot = snapshot_of(home)
    assert ckptpub.read_manifest(snapshot).identity == identity  # the manifest lives in the snapshot
    verified = cli(home, "verify", REPO)
    assert verified.returncode == 0, verified.stderr
    assert f"OK, 7 files, 10 tensors, identity {identity}" in verified.stderr
    shown = cli(home, "show", REPO, "--json")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["identity"] == identity
    assert summary["folder"] == str(snapshot)
    assert summary["provenance"]["hub"] == {"repo_id": REPO, "revision": snapshot.name}
    lines = cli(home, "show", REPO).stdout
    assert f"hub:      {REPO}@{snapshot.name}" in lines
    assert cache_state(home) == before  # blobs byte for byte, links, times: nothing changed


def test_a_snapshot_folder_publishes_as_its_hub_id_does(home: Path) -> None:
    snapshot = snapshot_of(home)
    by_folder = cli(home, "publish", snapshot)
    assert by_folder.returncode == 0, by_folder.stderr
    assert ckptpub.read_manifest(snapshot).provenance["hub"] == {"repo_id": REPO, "revision": snapshot.name}
    assert cli(home, "show", REPO).returncode == 0


def test_hub_records_are_canonical_json_on_the_first_line_and_outside_the_identity(
    home: Path, tmp_path: Path
) -> None:
    """ckptpub/3 writes provenance.hub and base_hub as their canonical JSON in the first line (docs/format.md,
    *Provenance*); json.load and ckptpub read them back alike, and neither changes an identity."""
    assert cli(home, "publish", REPO).returncode == 0
    snapshot = snapshot_of(home)
    tuned = write_checkpoint(tmp_path / "tuned", model_tensors(seed=5))
    assert cli(home, "publish", tuned, "--base", REPO).returncode == 0
    record = {"repo_id": REPO, "revision": snapshot.name}
    for folder, key in ((snapshot, "hub"), (tuned, "base_hub")):
        data = (folder / ckptpub.MANIFEST_NAME).read_bytes()
        first_line = data.partition(b"\n")[0]
        assert first_line.startswith(b'{"format":"ckptpub/3",')
        assert b'"%s":%s' % (key.encode(), canonical_json(record)) in first_line
        assert json.loads(data)["provenance"][key] == ckptpub.read_manifest(folder).provenance[key] == record
    plain = tmp_path / "plain"
    shutil.copytree(snapshot, plain)  # the links' files, as a folder outside the cache
    (plain / ckptpub.MANIFEST_NAME).unlink()
    copied = ckptpub.build_manifest(plain)
    assert "hub" not in copied.provenance
    assert copied.identity == ckptpub.read_manifest(snapshot).identity
    assert ckptpub.build_manifest(tuned).identity == ckptpub.read_manifest(tuned).identity  # no base recorded


def test_revision_by_option_or_after_an_at_sign(home: Path, tmp_path: Path) -> None:
    other = write_checkpoint(tmp_path / "v2", model_tensors(seed=1))
    second = Path(cache_model(home, REPO, other, ref="v2"))
    assert snapshot_of(home, "v2") == second
    assert cli(home, "publish", REPO, "--revision", "v2").returncode == 0
    main_shown = cli(home, "show", REPO)
    assert main_shown.returncode == 2
    assert "no ckptpub.json" in main_shown.stderr  # main is another commit, not published
    for spelled in ([f"{REPO}@v2"], [f"{REPO}@{second.name}"], [REPO, "--revision", second.name]):
        shown = cli(home, "show", *spelled, "--json")
        assert shown.returncode == 0, (spelled, shown.stderr)
        assert json.loads(shown.stdout)["provenance"]["hub"]["revision"] == second.name


def test_names_that_resolve_to_nothing_are_one_line_exit_2(home: Path) -> None:
    for args, words in [
        (["show", "acme/absent"], "no snapshot of the model acme/absent in the Hugging Face cache"),
        (["show", REPO, "--revision", "nope"], "at revision nope"),
        (["verify", f"{REPO}@main", "--revision", "v2"], "give the revision once"),
        (["show", str(snapshot_of(home)), "--revision", "main"], "a folder has no revision"),
        (["publish", "no/such/folder"], "no/such/folder"),
    ]:
        result = cli(home, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert words in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback


def test_a_folder_that_exists_wins_over_a_hub_id(home: Path, tmp_path: Path) -> None:
    assert cli(home, "publish", REPO).returncode == 0
    local = write_checkpoint(tmp_path / "work" / "acme" / "tiny-qwen3", model_tensors(seed=7))
    local_identity = ckptpub.publish(local).identity
    shown = cli(home, "show", REPO, "--json", cwd=tmp_path / "work")
    assert json.loads(shown.stdout)["identity"] == local_identity
    assert json.loads(cli(home, "show", REPO, "--json").stdout)["identity"] != local_identity


def test_a_tampered_blob_is_found_by_tensor_name(home: Path) -> None:
    assert cli(home, "publish", REPO).returncode == 0
    flip_byte(*blob_holding(snapshot_of(home), "model.norm.weight"))
    result = cli(home, "verify", REPO)
    assert result.returncode == 1
    assert "FAILED (tensor 'model.norm.weight' bytes differ" in result.stdout


def test_links_anywhere_but_the_repository_blobs_are_still_refused(home: Path, tmp_path: Path) -> None:
    snapshot = snapshot_of(home)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    other = Path(cache_model(home, "acme/other", write_checkpoint(tmp_path / "other", model_tensors(seed=3))))
    other_blob = os.path.realpath(other / "config.json")
    for name, target in [("stray.json", outside), ("borrowed.json", other_blob)]:
        link = snapshot / name
        link.symlink_to(target)
        result = cli(home, "publish", REPO)
        assert result.returncode == 2, result.stderr
        assert f"{name}: symlink points outside the checkpoint folder" in result.stderr
        link.unlink()
    # An ordinary folder keeps its rule: a link into a folder called blobs beside it is refused too.
    plain = write_checkpoint(tmp_path / "plain" / "snapshots" / "x", extra_files=False)
    (tmp_path / "plain" / "blobs").mkdir()
    (tmp_path / "plain" / "blobs" / "b").write_text("{}")
    (plain / "extra.json").symlink_to("../../blobs/b")
    result = cli(home, "publish", plain)
    assert result.returncode == 2
    assert "extra.json: symlink points outside the checkpoint folder" in result.stderr


def test_blobs_in_the_shared_store_are_the_models_files(tmp_path: Path) -> None:
    """huggingface_hub 2 keeps Xet files in a cache-wide store that each repository's blobs link to."""
    home = tmp_path / "hf"
    snapshot = Path(cache_model(home, REPO, write_checkpoint(tmp_path / "download"), shared=True))
    store_file = os.path.realpath(snapshot / "model.safetensors")
    assert os.path.dirname(os.path.dirname(store_file)) == os.path.join(cache_dir(home), "blobs")
    before = cache_state(home)
    assert cli(home, "publish", REPO).returncode == 0
    assert cli(home, "verify", REPO).returncode == 0
    assert cache_state(home) == before
    os.chmod(store_file, 0o644)  # the store keeps its files read-only
    flip_byte(Path(store_file), tensor_range(Path(store_file), "model.norm.weight")[0])
    result = cli(home, "verify", REPO)
    assert result.returncode == 1
    assert "tensor 'model.norm.weight' bytes differ" in result.stdout


def test_the_hub_librarys_own_tools_keep_working_on_a_published_cache(home: Path, tmp_path: Path) -> None:
    from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download

    second = Path(cache_model(home, REPO, write_checkpoint(tmp_path / "v2", model_tensors(seed=1)), ref="v2"))
    first = snapshot_of(home)
    for revision in ("main", "v2"):
        assert cli(home, "publish", REPO, "--revision", revision).returncode == 0
    cache = cache_dir(home)
    info = scan_cache_dir(cache)
    assert info.warnings == []
    (repo,) = info.repos
    assert {r.commit_hash: r.refs for r in repo.revisions} == {first.name: {"main"}, second.name: {"v2"}}
    for revision in repo.revisions:  # the manifest is a file of its revision, like any file made there
        assert "ckptpub.json" in {f.file_name for f in revision.files}
    assert Path(snapshot_download(REPO, cache_dir=cache, local_files_only=True)) == first
    config = hf_hub_download(REPO, "config.json", cache_dir=cache, local_files_only=True)
    assert Path(config) == first / "config.json"
    # delete-cache: one revision goes with its manifest; the other revision and its manifest stay.
    info.delete_revisions(first.name).execute()
    assert not first.exists()
    assert ckptpub.read_manifest(second).provenance["hub"]["revision"] == second.name
    assert cli(home, "verify", REPO, "--revision", "v2").returncode == 0
    after = scan_cache_dir(cache)
    assert after.warnings == []
    scan_cache_dir(cache).delete_revisions(second.name).execute()
    assert os.listdir(cache) == []


def test_lineage_names_the_base_by_hub_id_and_commit(home: Path, tmp_path: Path) -> None:
    assert cli(home, "publish", REPO).returncode == 0
    commit = snapshot_of(home).name
    run = tmp_path / "run"
    tuned = write_checkpoint(run / "checkpoint-5", model_tensors(seed=5))
    assert cli(home, "publish", tuned, "--base", REPO).returncode == 0
    provenance = ckptpub.read_manifest(tuned).provenance
    assert provenance["base_identity"] == ckptpub.read_manifest(snapshot_of(home)).identity
    assert provenance["base_hub"] == {"repo_id": REPO, "revision": commit}
    shown = cli(home, "show", tuned).stdout
    assert f"on base {provenance['base_identity']} ({REPO}@{commit})" in shown
    diff = cli(home, "diff", REPO, tuned)
    assert diff.returncode == 1
    assert f"lineage  b records a ({REPO}@{commit[:12]}) as its base" in diff.stdout
    assert json.loads(cli(home, "diff", REPO, tuned, "--json").stdout)["base_hub_b"] == f"{REPO}@{commit}"
    log = cli(home, "log", run).stdout
    assert f"base {provenance['base_identity'][:19]} {REPO}@{commit[:12]} (not in this run)" in log
    shutil.rmtree(run)
