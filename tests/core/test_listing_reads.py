"""``ckptpub ls`` and ``log`` read what they show (issue 35 item 3), and still report what they cannot use.

A listing checks each manifest's first line and recomputes its identity, not every
tensor entry (docs/format.md, "What each reader checks"). These tests hold it to
that on real folders through the real CLI: a valid run lists what ``show`` (which
checks every entry) shows, a manifest broken in a field the listing reads or in its
identity is one ``UNUSABLE`` row with one ``#`` line, and a manifest broken only in
its entries is listed by the identity it commits to while ``show`` and ``verify``
refuse it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from support.checkpoints import (
    forged_regions,
    model_tensors,
    run_cli,
    swap_first_entries,
    v3_parts,
    v3_written,
    write_checkpoint,
)

import ckptpub
from ckptpub._filesystem import run_index

VIEWS = (("ls",), ("ls", "--tree"), ("log",))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run of three published steps in its run index; the third records the first as its base."""
    run = tmp_path / "run"
    for step in (10, 20, 30):
        folder = write_checkpoint(run / f"checkpoint-{step}", model_tensors(seed=step), extra_files=False)
        base = run / "checkpoint-10" if step == 30 else None
        identity = ckptpub.publish(folder, provenance={"step": step}, base=base).identity
        run_index.append(run, step=step, path=f"checkpoint-{step}", identity=identity, time=0.0)
    return run


def test_a_valid_run_lists_what_show_shows(run: Path) -> None:
    """Every field a listing prints is the one ``show --json``, which checks every entry, prints."""
    result = run_cli("ls", "--json", run)
    assert (result.returncode, result.stderr) == (0, f"ckptpub: 3 published checkpoints under {run}\n")
    for entry in json.loads(result.stdout):
        shown = json.loads(run_cli("show", "--json", run / entry["path"]).stdout)
        assert entry["status"] == "ok"
        assert entry["identity"] == shown["identity"]
        assert entry["size"] == shown["bytes"]
        assert entry["step"] == shown["provenance"]["step"]
        assert entry["base_identity"] == shown["provenance"].get("base_identity")
    ids = {step: ckptpub.read_manifest(run / f"checkpoint-{step}").identity[:19] for step in (10, 20, 30)}
    log = run_cli("log", run)
    assert (log.returncode, log.stdout.splitlines()) == (
        0,
        [
            "(no base recorded)",
            f"|- step 10    {ids[10]}  checkpoint-10",
            f"|  `- step 30    {ids[30]}  checkpoint-30",  # its recorded base is step 10
            f"`- step 20    {ids[20]}  checkpoint-20",
        ],
    ), log.stderr


def edit_first_line(edit: Callable[[dict], dict]) -> Callable[[bytes], bytes]:
    """The manifest with its first line's fields edited and nothing recomputed, as a hand edit leaves it."""

    def damage(data: bytes) -> bytes:
        header, model, layout = v3_parts(data)
        return v3_written(edit(header), model, layout)

    return damage


def files_edited(change: Callable[[dict], None]) -> Callable[[dict], dict]:
    def edit(header: dict) -> dict:
        change(header["files"][0])
        return header

    return edit


#: A manifest broken in what a listing reads (its identity, sizes, files, provenance), and the reason.
FIRST_LINE_DAMAGE = {
    "identity edited": (
        edit_first_line(lambda h: h | {"identity": "blake3:" + "0" * 64}),
        "recorded identity does not match the manifest's own entries (edited or corrupt manifest)",
    ),
    "a file size negative": (
        edit_first_line(files_edited(lambda f: f.update(size=-1))),
        "config.json: size: -1 is not a non-negative integer",
    ),
    "provenance not an object": (
        edit_first_line(lambda h: h | {"provenance": [1]}),
        "provenance is not an object",
    ),
    "first line not canonical": (
        lambda data: data.replace(b'"provenance":{', b'"provenance": {', 1),
        "first line is not in canonical form (fields in order, canonical JSON values)",
    ),
    "regions cut short": (
        lambda data: data[: data.index(b"\n") + 200],
        "regions do not have the sizes the first line says",
    ),
}


@pytest.mark.parametrize("damage", FIRST_LINE_DAMAGE, ids=list(FIRST_LINE_DAMAGE))
@pytest.mark.parametrize("view", VIEWS, ids=[" ".join(v) for v in VIEWS])
def test_a_manifest_broken_in_what_a_listing_reads_is_reported(run: Path, damage: str, view: tuple) -> None:
    edit, reason = FIRST_LINE_DAMAGE[damage]
    manifest = run / "checkpoint-20" / "ckptpub.json"
    manifest.write_bytes(edit(manifest.read_bytes()))
    result = run_cli(*view, run)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == f"ckptpub: 2 published checkpoints under {run}, 1 unusable\n"
    assert [line for line in result.stdout.splitlines() if "UNUSABLE" in line and "checkpoint-20" in line]
    notes = [line for line in result.stdout.splitlines() if line.startswith("#")]
    assert len(notes) == 1, result.stdout
    assert notes[0].startswith(f"# {manifest}: {reason}"), result.stdout


def test_entries_broken_past_the_first_line_are_listed_by_their_identity_and_refused_by_show(
    tmp_path: Path, run: Path
) -> None:
    """A careful forger's entries (sorted wrong, identity recomputed): ``ls`` lists the identity they commit
    to, which no valid manifest has and the run index did not record; ``show`` and ``verify`` refuse it."""
    manifest = run / "checkpoint-20" / "ckptpub.json"
    manifest.write_bytes(forged_regions(manifest.read_bytes(), lambda m, lay: (swap_first_entries(m), lay)))
    forged = ckptpub.read_manifest(manifest, check_tables=False).identity
    (run / "ckptpub-index.jsonl").unlink()  # the index would name the mismatch; the scan has only the folder
    result = run_cli("ls", "--json", run)
    assert result.returncode == 0, result.stderr
    assert [e["identity"] for e in json.loads(result.stdout) if e["path"] == "checkpoint-20"] == [forged]
    for verb in ("show", "verify"):
        refused = run_cli(verb, run / "checkpoint-20")
        assert refused.returncode == 2, refused.stdout
        assert "model region: names are not sorted and unique" in refused.stderr
