"""Property tests: any single flipped byte anywhere is caught; any sharding keeps the identity."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.checkpoints import flip_byte, model_tensors, write_checkpoint

import ckptpub

TENSORS = model_tensors(seed=7)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, int]]]:
    folder = write_checkpoint(tmp_path_factory.mktemp("prop") / "ckpt", TENSORS, shards=2)
    ckptpub.publish(folder)
    files = [(str(p.relative_to(folder)), p.stat().st_size) for p in sorted(folder.rglob("*")) if p.is_file()]
    return folder, files


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_flipped_byte_is_caught(published, data) -> None:
    folder, files = published
    path, size = data.draw(st.sampled_from([f for f in files if f[1] > 0]), label="file")
    offset = data.draw(st.integers(0, size - 1), label="offset")
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "copy"
        shutil.copytree(folder, copy)
        flip_byte(copy / path, offset)
        if path == "ckptpub.json":
            with pytest.raises(ckptpub.CkptpubError):
                ckptpub.verify(copy)  # a damaged manifest is unusable, never trusted
            return
        report = ckptpub.verify(copy)
        assert not report.ok
        assert {p.path for p in report.problems} >= {path}


@settings(max_examples=25, deadline=None)
@given(
    assignment=st.lists(st.integers(0, 5), min_size=len(TENSORS), max_size=len(TENSORS)),
    metadata=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
)
def test_any_sharding_keeps_identity(assignment: list[int], metadata: dict[str, str]) -> None:
    names = sorted(TENSORS)
    with tempfile.TemporaryDirectory() as scratch:
        reference = write_checkpoint(Path(scratch) / "reference", TENSORS, extra_files=False)
        expected = ckptpub.build_manifest(reference).identity
        import json

        from safetensors.numpy import save_file

        folder = Path(scratch) / "resharded"
        folder.mkdir()
        shutil.copy(reference / "config.json", folder / "config.json")
        shards: dict[int, list[str]] = {}
        for name, shard in zip(names, assignment, strict=True):
            shards.setdefault(shard, []).append(name)
        weight_map = {}
        for shard, members in shards.items():
            file = f"part-{shard}.safetensors"
            save_file({n: TENSORS[n] for n in members}, str(folder / file), metadata=metadata or None)
            weight_map.update({n: file for n in members})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        assert ckptpub.build_manifest(folder).identity == expected
