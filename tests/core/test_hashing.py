"""The hashing engine on real files: every span's digest is BLAKE3 of exactly its bytes, whatever the
span sizes, order, overlap, read mode or thread count, and small spans are hashed in batches."""

from __future__ import annotations

import os
import random
from pathlib import Path

import blake3
import pytest

from ckptpub._hashing.engine import BATCH_BYTES, SMALL_SPAN_BYTES, Span, hash_spans
from ckptpub.errors import CkptpubError


def expected(span: Span) -> str:
    with open(span.path, "rb") as handle:
        handle.seek(span.start)
        return "blake3:" + blake3.blake3(handle.read(span.size)).hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("hashing")
    rng = random.Random(13)
    paths = []
    for index, size in enumerate((3 * SMALL_SPAN_BYTES + 12345, BATCH_BYTES + 4097, 70_000, 0)):
        path = folder / f"file-{index}.bin"
        path.write_bytes(rng.randbytes(size))
        paths.append(path)
    return paths


def mixed_spans(files: list[Path]) -> list[Span]:
    """Tiny, empty, small, large, overlapping and out-of-order spans over files of several sizes."""
    rng = random.Random(7)
    spans = []
    for path in files:
        size = path.stat().st_size
        offset = 0
        while offset < size:  # tile the file with spans from 0 bytes to 2 MiB
            length = min(
                size - offset, rng.choice((0, 1, 17, 1024, 4096, 300_000, SMALL_SPAN_BYTES + 1, 2 << 20))
            )
            spans.append(Span(str(path), offset, offset + length, path.name, tensor=f"t{len(spans)}"))
            offset += length
        for _ in range(20):  # and ranges that overlap the tiling
            start = rng.randrange(size + 1)
            spans.append(Span(str(path), start, rng.randrange(start, size + 1), path.name))
    rng.shuffle(spans)
    return spans


@pytest.mark.parametrize("use_mmap", [True, False], ids=["mmap", "pread"])
@pytest.mark.parametrize("threads", [1, 3])
def test_every_span_gets_the_digest_of_exactly_its_bytes(
    files: list[Path], use_mmap: bool, threads: int
) -> None:
    spans = mixed_spans(files)
    assert any(s.size > SMALL_SPAN_BYTES for s in spans)
    assert any(s.size == 0 for s in spans)
    assert hash_spans(spans, threads=threads, use_mmap=use_mmap) == [expected(s) for s in spans]


def test_small_spans_of_a_file_are_hashed_in_batches_with_one_progress_report_each(tmp_path: Path) -> None:
    """10,000 tensors of 1 KiB in one 10 MiB file: two batches (BATCH_BYTES is 8 MiB), so two reports."""
    path = tmp_path / "experts.bin"
    path.write_bytes(os.urandom(10_000 * 1024))
    spans = [Span(str(path), i * 1024, (i + 1) * 1024, path.name, tensor=f"e{i}") for i in range(10_000)]
    reports: list[tuple[int, int]] = []
    for use_mmap in (True, False):
        reports.clear()
        digests = hash_spans(
            spans, threads=2, use_mmap=use_mmap, on_progress=lambda d, t: reports.append((d, t))
        )
        assert digests[::997] == [expected(s) for s in spans[::997]]
        assert len(reports) == -(-len(path.read_bytes()) // BATCH_BYTES) == 2
        assert sorted(reports)[-1] == (10_000 * 1024, 10_000 * 1024)


@pytest.mark.parametrize("use_mmap", [True, False], ids=["mmap", "pread"])
def test_a_file_shorter_than_its_spans_is_refused_by_name(tmp_path: Path, use_mmap: bool) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(os.urandom(4096))
    spans = [Span(str(path), i * 1024, (i + 1) * 1024, "model.safetensors", tensor=f"w{i}") for i in range(5)]
    with pytest.raises(
        CkptpubError, match=r"^model\.safetensors: tensor 'w4': file is 4096 bytes, shorter than"
    ):
        hash_spans(spans, use_mmap=use_mmap)
    big = [Span(str(path), 0, 2 * SMALL_SPAN_BYTES, "model.safetensors", tensor="embed")]
    with pytest.raises(CkptpubError, match=r"^model\.safetensors: tensor 'embed': file is 4096 bytes"):
        hash_spans(big, use_mmap=use_mmap)


def test_overlapping_small_spans_that_add_up_to_more_than_a_huge_span_each_get_their_digest(
    tmp_path: Path,
) -> None:
    """40 spans over one 1 MiB range add up to 40 MiB, above the all-cores size; each is still small."""
    path = tmp_path / "one.bin"
    path.write_bytes(os.urandom(SMALL_SPAN_BYTES))
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(100))
    spans = [Span(str(path), 0, SMALL_SPAN_BYTES, "one.bin", tensor=f"t{i}") for i in range(40)]
    spans.append(Span(str(other), 0, 100, "other.bin"))
    assert hash_spans(spans, threads=2) == [expected(s) for s in spans]
