"""The hashing engine: BLAKE3 digests of many byte ranges of many files, as fast as b3sum.

It knows nothing about checkpoints: callers hand it ``Span`` s (a file and a byte
range) and get one digest per span. Each byte is read once.

Performance choices, measured in ``docs/performance.md``:

* Memory-mapped reads (default). Hashing a mapped range avoids copying the page
  cache into Python buffers, and mapped pages are file-backed, so the process's own
  (anonymous) memory stays small whatever the checkpoint size. On a spinning disk
  or a network file system where a sequential ``pread`` stream beats page-fault
  driven reads, pass ``use_mmap=False``: each worker then reads through one
  reusable ``READ_BUFFER_BYTES`` buffer, so memory stays bounded by the thread count.
* Parallel across spans: ``threads`` workers (default: the CPU count) take spans
  largest first, so the tail of the run is short spans. The ``blake3`` module
  releases the GIL for inputs of 2 KiB and more, so Python threads hash in parallel.
* One hasher per span, single-threaded, is the cheapest way to hash: BLAKE3's
  multi-threaded mode (what b3sum uses per file) splits work down to 16 KiB pieces
  and pays for every split, measurably (see docs/performance.md). Only a span too
  big to balance (more than ``1 / (2 * threads)`` of all bytes, and at least
  ``SPLIT_MIN_BYTES``) is hashed with all cores, in a first phase on its own, so
  one huge embedding cannot leave cores idle at the end.
* Spans are fed in ``CHUNK_BYTES`` pieces so progress can be reported while a large
  tensor is hashed; the piece size is far above BLAKE3's chunk size, so it costs nothing.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import blake3

from .errors import CkptpubError
from .safe_open import open_regular

#: ``on_progress(done_bytes, total_bytes)``, called as hashing advances.
ProgressCallback = Callable[[int, int], None]

DIGEST_PREFIX = "blake3:"
SPLIT_MIN_BYTES = 32 << 20
CHUNK_BYTES = 64 << 20
READ_BUFFER_BYTES = 8 << 20


class Span(NamedTuple):
    """Bytes ``[start, end)`` of the file at ``path``; ``name`` is used in error messages.

    ``expect``, when set, is the ``(st_dev, st_ino)`` the folder scan saw: the file
    opened must be that one (see ``safe_open``).
    """

    path: str
    start: int
    end: int
    name: str
    expect: tuple[int, int] | None = None

    @property
    def size(self) -> int:
        return self.end - self.start


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """The ckptpub digest (``"blake3:<64 hex>"``) of a bytes-like object.

    >>> digest_bytes(b"")
    'blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262'
    """
    return DIGEST_PREFIX + blake3.blake3(data).hexdigest()


def default_threads() -> int:
    """One worker per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def hash_spans(
    spans: Sequence[Span],
    *,
    threads: int | None = None,
    use_mmap: bool = True,
    on_progress: ProgressCallback | None = None,
    file_sha256: list[str] | None = None,
) -> list[str]:
    """Return the digest of each span, in the order given.

    ``on_progress(done_bytes, total_bytes)`` is called after each piece is hashed
    (from worker threads, one call at a time). Raises ``CkptpubError`` naming the file when one cannot be
    read or is shorter than a span needs.

    ``file_sha256``, when a list, receives the SHA-256 (hex) of each whole file, in
    file order, computed from the very pieces BLAKE3 reads (what a signature needs,
    see ``ckptpub.signing``). The spans must then come file by file, each file's
    spans in offset order tiling it from 0 to its end, as ``publishing`` builds them;
    a file is hashed in order by one worker, so work is parallel across files only.
    """
    report = _progress_reporter(sum(s.size for s in spans), on_progress)
    digests: list[str] = [""] * len(spans)
    if file_sha256 is not None:
        file_sha256.extend(_hash_whole_files(spans, digests, threads, use_mmap, report))
        return digests
    workers = min(threads or default_threads(), max(1, len(spans)))
    # Largest first, so the last spans to finish are short ones and no core idles long.
    order = sorted(range(len(spans)), key=lambda i: spans[i].size, reverse=True)
    split_above = max(SPLIT_MIN_BYTES, sum(s.size for s in spans) // (2 * workers))
    huge = [i for i in order if workers > 1 and spans[i].size > split_above]
    with _Files(use_mmap) as files:
        for index in huge:
            digests[index] = _hash_span(spans[index], files, report, all_cores=True)
        rest = order[len(huge) :]
        _run_parallel(rest, lambda i: digests.__setitem__(i, _hash_span(spans[i], files, report)), workers)
    return digests


def _hash_whole_files(
    spans: Sequence[Span],
    digests: list[str],
    threads: int | None,
    use_mmap: bool,
    report: Callable[[int], None],
) -> list[str]:
    """Fill ``digests`` file by file, each file's pieces fed to a SHA-256 too; return those, by file."""
    import hashlib  # only signing needs it: not on every publish's start-up

    starts = [i for i, span in enumerate(spans) if span.start == 0] + [len(spans)]
    if starts[0] != 0:
        raise CkptpubError(f"{spans[0].name}: spans must start each file at offset 0")
    groups = [spans[begin:end] for begin, end in zip(starts, starts[1:], strict=False)]
    firsts = starts[:-1]
    sha256: list[str] = [""] * len(groups)

    def hash_file(group: int) -> None:
        whole, end = hashlib.sha256(), 0
        for index, span in enumerate(groups[group], firsts[group]):
            if span.start != end or span.path != groups[group][0].path:
                raise CkptpubError(f"{span.name}: spans of a file must tile it in order")
            digests[index] = _hash_span(span, files, report, also=whole.update)
            end = span.end
        if end != files.size(groups[group][0]):
            raise CkptpubError(f"{groups[group][0].name}: spans do not cover the whole file")
        sha256[group] = whole.hexdigest()

    largest_first = sorted(range(len(groups)), key=lambda g: groups[g][-1].end, reverse=True)
    with _Files(use_mmap) as files:
        _run_parallel(largest_first, hash_file, min(threads or default_threads(), max(1, len(groups))))
    return sha256


def _run_parallel(items: list[int], work: Callable[[int], None], workers: int) -> None:
    """Run ``work`` on every item with ``workers`` threads taking the next item in turn.

    The calling thread is one of the workers. The first error (or an interrupt while
    waiting) stops the other workers after the item each is on, and is raised here.
    The helpers are daemon threads, so an interrupted command exits without waiting
    for them.
    """
    pending = iter(items)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while not errors:
            with lock:
                item = next(pending, None)
            if item is None:
                return
            try:
                work(item)
            except BaseException as error:  # handed to the caller below
                errors.append(error)

    helpers = [threading.Thread(target=worker, name="ckptpub-hash", daemon=True) for _ in range(workers - 1)]
    for helper in helpers:
        helper.start()
    try:
        worker()
        for helper in helpers:
            helper.join()
    except BaseException as error:  # KeyboardInterrupt while joining: stop the helpers too
        errors.append(error)
        raise
    if errors:
        raise errors[0]


def _progress_reporter(total: int, on_progress: ProgressCallback | None) -> Callable[[int], None]:
    if on_progress is None:
        return lambda _: None
    done = 0
    lock = threading.Lock()

    def advance(count: int) -> None:
        nonlocal done
        with lock:
            done += count
            on_progress(done, total)

    return advance


def _hash_span(
    span: Span,
    files: _Files,
    report: Callable[[int], None],
    all_cores: bool = False,
    also: Callable[[memoryview | bytes], object] | None = None,
) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO) if all_cores else blake3.blake3()
    for piece in files.pieces(span):
        hasher.update(piece)
        if also is not None:
            also(piece)
        report(len(piece))
    return DIGEST_PREFIX + hasher.hexdigest()


class _Files:
    """Open files (and their maps) shared by all workers, closed together at the end."""

    def __init__(self, use_mmap: bool) -> None:
        self._use_mmap = use_mmap
        self._lock = threading.Lock()
        self._open: dict[str, tuple[int, int, mmap.mmap | None]] = {}
        self._buffers: dict[int, bytearray] = {}  # one read buffer per thread (by thread id)

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd, _, mapping in self._open.values():
            if mapping is not None:
                with contextlib.suppress(BufferError):  # a worker that failed may still hold a view
                    mapping.close()
            os.close(fd)
        self._open.clear()

    def size(self, span: Span) -> int:
        """The size of the span's file, as ``fstat`` saw it when it was opened."""
        return self._get(span)[1]

    def pieces(self, span: Span) -> Iterator[memoryview | bytes]:
        fd, size, mapping = self._get(span)
        if span.end > size:
            raise CkptpubError(f"{span.name}: file is {size} bytes, shorter than expected ({span.end})")
        if mapping is not None:
            view = memoryview(mapping)
            try:
                for offset in range(span.start, span.end, CHUNK_BYTES):
                    yield view[offset : min(offset + CHUNK_BYTES, span.end)]
            finally:
                view.release()
            return
        buffer = self._buffer()
        offset = span.start
        while offset < span.end:
            want = min(READ_BUFFER_BYTES, span.end - offset)
            view = memoryview(buffer)[:want]
            got = _pread_into(fd, view, offset, span.name)
            yield view[:got]
            offset += got

    def _get(self, span: Span) -> tuple[int, int, mmap.mmap | None]:
        with self._lock:
            entry = self._open.get(span.path)
            if entry is None:
                entry = self._open[span.path] = self._open_file(span)
            return entry

    def _open_file(self, span: Span) -> tuple[int, int, mmap.mmap | None]:
        fd, info = open_regular(span.path, span.name.partition(": tensor ")[0], span.expect)
        try:
            size = info.st_size
            mapping = None
            if self._use_mmap and size > 0:
                mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                if hasattr(mapping, "madvise"):
                    mapping.madvise(mmap.MADV_SEQUENTIAL)
        except (OSError, ValueError) as error:
            os.close(fd)
            raise CkptpubError(
                f"{span.name}: cannot map: {getattr(error, 'strerror', None) or error}"
            ) from None
        return fd, size, mapping

    def _buffer(self) -> bytearray:
        thread = threading.get_ident()
        with self._lock:
            buffer = self._buffers.get(thread)
            if buffer is None:
                buffer = self._buffers[thread] = bytearray(READ_BUFFER_BYTES)
            return buffer


def _pread_into(fd: int, view: memoryview, offset: int, name: str) -> int:
    try:
        got = os.preadv(fd, [view], offset)
    except OSError as error:
        raise CkptpubError(f"{name}: read failed: {error.strerror or error}") from None
    if got == 0:
        raise CkptpubError(f"{name}: file shrank while it was being hashed")
    return got
