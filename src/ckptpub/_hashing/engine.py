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
* Parallel across spans: ``threads`` workers (default: the CPU count) take work
  items (a span, or a batch of small ones, below) largest first, so the tail of the
  run is short ones. The ``blake3`` module
  releases the GIL for inputs of 2 KiB and more, so Python threads hash in parallel.
* One hasher per span, single-threaded, is the cheapest way to hash: BLAKE3's
  multi-threaded mode (what b3sum uses per file) splits work down to 16 KiB pieces
  and pays for every split, measurably (see docs/performance.md). Only a span too
  big to balance (more than ``1 / (2 * threads)`` of all bytes, and at least
  ``SPLIT_MIN_BYTES``) is hashed with all cores, in a first phase on its own, so
  one huge embedding cannot leave cores idle at the end.
* Spans are fed in ``CHUNK_BYTES`` pieces so progress can be reported while a large
  tensor is hashed; the piece size is far above BLAKE3's chunk size, so it costs nothing.
* Small spans (``SMALL_SPAN_BYTES`` or less: the experts, norms and biases of a
  mixture-of-experts checkpoint, tens of thousands per model) are hashed in batches of
  neighbours in one file, up to ``BATCH_BYTES`` apart: one read (or one mapped view),
  one file lookup and one progress report per batch instead of per span, so a
  100k-tensor checkpoint costs about 1.5 us per tensor beyond BLAKE3 itself (which
  takes 1.4 us for 1 KiB: one chunk is hashed serially, and the ``blake3`` module
  keeps the GIL for inputs under 2 KiB).
* Objects of an ``s3://`` prefix are never mapped: each read is a ranged GET into the
  worker's buffer, and a request costs a round trip and the client's own work, so their
  reads are larger (``OBJECT_READS``: 16 MiB, neighbours together) and ``READ_THREADS``
  of them are in flight.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple, Protocol, TypeVar

import blake3

from .._filesystem.objects import OBJECT_READ_BYTES, READ_THREADS, is_object_url
from .._filesystem.safe_open import FileId
from .._filesystem.sources import LocalFile, Source, open_source
from .._format.digest import DIGEST_PREFIX
from ..errors import CkptpubError

_T = TypeVar("_T")

#: ``on_progress(done_bytes, total_bytes)``, called as hashing advances.
ProgressCallback = Callable[[int, int], None]

SPLIT_MIN_BYTES = 32 << 20
CHUNK_BYTES = 64 << 20
READ_BUFFER_BYTES = 8 << 20
SMALL_SPAN_BYTES = 1 << 20
BATCH_BYTES = READ_BUFFER_BYTES  # a batch is read into one worker's buffer


class ReadSizes(NamedTuple):
    """How much one read takes: a span over ``small_span`` bytes is read alone, in pieces of ``buffer``
    bytes (one worker's reused buffer); smaller neighbours of one file are read together, up to
    ``buffer`` bytes from the first one's start."""

    small_span: int
    buffer: int


#: A folder's files: small reads are cheap (a ``pread``, or a view of the mapping).
LOCAL_READS = ReadSizes(SMALL_SPAN_BYTES, READ_BUFFER_BYTES)
#: An ``s3://`` object's: every read is a GET with its round trip and its request cost, so fewer, larger
#: ones (docs/performance.md: 163 shards in 332 requests instead of 821, at a plain download's speed).
OBJECT_READS = ReadSizes(OBJECT_READ_BYTES, OBJECT_READ_BYTES)


def read_sizes(spans: Sequence[Span]) -> ReadSizes:
    """The read sizes for ``spans`` (``OBJECT_READS`` for objects, ``LOCAL_READS`` for files)."""
    return OBJECT_READS if spans and is_object_url(spans[0].path) else LOCAL_READS


CACHED_BYTES = 512 << 10  # what a core's cache holds while two hashers take it in turn (``hash_files``)


class Span(NamedTuple):
    """Bytes ``[start, end)`` of the file at ``path``, shown as ``name`` (and ``tensor``) in errors.

    ``expect``, when set, is which file the folder scan saw (``(st_dev, st_ino)``, or an
    object's ``(etag, size)``): the file read must be that one (see ``sources``).
    ``tensor`` names the tensor whose bytes these are; kept apart from ``name`` so 100k
    tensor spans share their file's name instead of each formatting its own label.
    """

    path: str
    start: int
    end: int
    name: str
    expect: FileId | None = None
    tensor: str | None = None

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def label(self) -> str:
        """What an error says about the span: ``name``, or ``name: tensor 'x'``."""
        return self.name if self.tensor is None else f"{self.name}: tensor {self.tensor!r}"


def tensor_spans(
    path: str,
    name: str,
    expect: FileId | None,
    data_start: int,
    tensors: tuple[Iterable[str], Iterable[int], Iterable[int]],
) -> Iterator[Span]:
    """A span per tensor of one file, from columns: names, then begins and ends in its data region.

    The data region begins at ``data_start`` in the file. Built with ``map``, not a
    call per tensor: 100k spans in milliseconds.
    """
    names, begins, ends = tensors
    starts, stops = map(data_start.__add__, begins), map(data_start.__add__, ends)
    # The endless repeats stop where the names do.
    rows = zip(repeat(path), starts, stops, repeat(name), repeat(expect), names)
    return map(tuple.__new__, repeat(Span), rows)  # Span._make, without a call per span


def default_threads(spans: Sequence[Span] = ()) -> int:
    """One worker per CPU this process may run on; for objects (``s3://``), ``READ_THREADS``: their
    workers mostly wait for the store, so more requests in flight is what makes them fast."""
    if spans and is_object_url(spans[0].path):
        return READ_THREADS
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
) -> list[str]:
    """Return the digest of each span, in the order given.

    ``on_progress(done_bytes, total_bytes)`` is called after each piece is hashed
    (from worker threads, one call at a time). Raises ``CkptpubError`` naming the file when one cannot be
    read or is shorter than a span needs.
    """
    sizes = read_sizes(spans)
    items = _work_items(spans, 0, len(spans), sizes)
    total = sum(item.size for item in items)
    report = _progress_reporter(total, on_progress)
    digests: list[str] = [""] * len(spans)
    workers = min(threads or default_threads(spans), max(1, len(items)))
    # Largest first, so the last items to finish are short ones and no core idles long.
    items.sort(key=attrgetter("size"), reverse=True)
    split_above = max(SPLIT_MIN_BYTES, total // (2 * workers))
    # Only a single span is huge: a batch's spans lie within BATCH_BYTES (their sizes may add
    # up to more when they overlap, but each is small).
    huge: list[_WorkItem] = []
    rest: list[_WorkItem] = []
    for item in items:
        is_huge = workers > 1 and item.last - item.first == 1 and item.size > split_above
        (huge if is_huge else rest).append(item)
    with _Files(use_mmap, sizes) as files:
        for item in huge:
            digests[item.first] = _hash_span(spans[item.first], files, report, all_cores=True)
        _run_parallel(rest, lambda item: _hash_item(item, spans, digests, files, report), workers)
    return digests


#: The whole-file hashes ``hash_files`` computes beside the span digests: what a signature lists
#: (model_signing's names). BLAKE3 is plain, unkeyed BLAKE3 of the file, as ``b3sum`` prints it.
FILE_HASHES = ("sha256", "blake3")


class FileDigests(NamedTuple):
    """What ``hash_files`` returns: each span's BLAKE3 digest, and each whole file's digest (hex)."""

    spans: list[str]
    files: list[str]


def hash_files(
    spans: Sequence[Span],
    algorithm: str,
    *,
    threads: int | None = None,
    use_mmap: bool = True,
    on_progress: ProgressCallback | None = None,
) -> FileDigests:
    """``hash_spans``, and the ``algorithm`` digest (``FILE_HASHES``) of each whole file, in file order,
    from the very same reads.

    What a signature needs (see ``_operations.signing``): no byte is read twice. The
    whole-file hasher is fed each piece right after the span's own hasher, while the
    piece is still in the CPU's cache, so it costs its hashing alone (for BLAKE3 that
    is a second BLAKE3 of every byte: a file's digest shares no work with its tensors'
    digests, see ``docs/security.md``). The spans must come file by file, each file's
    spans in offset order tiling it from 0 to its end, as publishing builds them; a file
    is hashed in order by one worker, so work is parallel across files only.
    """
    new_hasher = new_file_hasher(algorithm)
    total = sum(s.size for s in spans)
    digests: list[str] = [""] * len(spans)
    report = _progress_reporter(total, on_progress)
    whole = _hash_whole_files(spans, digests, new_hasher, threads, use_mmap, report)
    return FileDigests(digests, whole)


def check_file_hash(algorithm: object, what: str = "whole-file hash") -> str:
    """``algorithm`` when it names one of ``FILE_HASHES``; a ``CkptpubError`` saying ``what`` otherwise."""
    if not isinstance(algorithm, str) or algorithm not in FILE_HASHES:
        raise CkptpubError(f"{what}: expected one of {', '.join(map(repr, FILE_HASHES))}, got {algorithm!r}")
    return algorithm


def new_file_hasher(algorithm: str) -> Callable[[], FileHasher]:
    """What makes a hasher of one of ``FILE_HASHES`` (``CkptpubError`` for another name)."""
    if check_file_hash(algorithm) == "blake3":
        return blake3.blake3
    import hashlib  # only a SHA-256 signature needs it: not on every publish's start-up

    return hashlib.sha256


class FileHasher(Protocol):
    """A whole-file hasher: ``hashlib.sha256()`` or ``blake3.blake3()``."""

    def update(self, data: memoryview | bytes, /) -> object: ...

    def hexdigest(self) -> str: ...


def _hash_whole_files(
    spans: Sequence[Span],
    digests: list[str],
    new_hasher: Callable[[], FileHasher],
    threads: int | None,
    use_mmap: bool,
    report: Callable[[int], None],
) -> list[str]:
    """Fill ``digests`` file by file, each file's bytes fed to a ``new_hasher()`` too; return those."""
    starts = [i for i, span in enumerate(spans) if span.start == 0] + [len(spans)]
    if starts[0] != 0:
        raise CkptpubError(f"{spans[0].label}: spans must start each file at offset 0")
    groups = list(zip(starts, starts[1:], strict=False))
    whole_digests: list[str] = [""] * len(groups)

    def hash_file(group: int) -> None:
        begin, end = groups[group]
        first, covered = spans[begin], 0
        for span in spans[begin:end]:
            if span.start != covered or span.path != first.path:
                raise CkptpubError(f"{span.label}: spans of a file must tile it in order")
            covered = span.end
        if covered != files.size(first):
            raise CkptpubError(f"{first.name}: spans do not cover the whole file")
        whole = new_hasher()
        for item in _work_items(spans, begin, end, sizes):  # tiling: every byte in order, once
            _hash_item(item, spans, digests, files, report, also=whole.update)
        whole_digests[group] = whole.hexdigest()

    largest_first = sorted(range(len(groups)), key=lambda g: spans[groups[g][1] - 1].end, reverse=True)
    sizes = read_sizes(spans)
    with _Files(use_mmap, sizes) as files:
        _run_parallel(largest_first, hash_file, min(threads or default_threads(spans), max(1, len(groups))))
    return whole_digests


class _WorkItem(NamedTuple):
    """Spans hashed together: ``spans[first:last]``, one large span or neighbouring small ones of one file.

    ``start`` and ``end`` bound the bytes the spans lie in; ``size`` is their total.
    """

    first: int
    last: int
    start: int
    end: int
    size: int


def _work_items(spans: Sequence[Span], first: int, last: int, sizes: ReadSizes) -> list[_WorkItem]:
    """Group ``spans[first:last]`` into units of work, keeping their order.

    A span over ``sizes.small_span`` is an item alone. A small span joins the item
    before it when that holds small spans of the same file, and the two fit within
    ``sizes.buffer`` from the item's start. Spans given file by file in offset order
    (as ``publish`` and ``verify`` build them) make the fewest items; any order is correct.
    One pass with no call per span: 100k tensors are grouped in tens of milliseconds.
    """
    small_span, batch_bytes = sizes
    items: list[_WorkItem] = []
    batch = first  # the first span of the small spans being grown into one item
    path, start, end, size = None, 0, 0, 0
    for index, span in enumerate(spans[first:last], first):
        length = span.end - span.start
        if length > small_span:
            if batch < index:
                items.append(_WorkItem(batch, index, start, end, size))
            items.append(_WorkItem(index, index + 1, span.start, span.end, length))
            batch, path = index + 1, None
        elif span.path == path and start <= span.start and span.end - start <= batch_bytes:
            end = span.end if span.end > end else end
            size += length
        else:
            if batch < index:
                items.append(_WorkItem(batch, index, start, end, size))
            batch, path, start, end, size = index, span.path, span.start, span.end, length
    if batch < last:
        items.append(_WorkItem(batch, last, start, end, size))
    return items


def _hash_item(
    item: _WorkItem,
    spans: Sequence[Span],
    digests: list[str],
    files: _Files,
    report: Callable[[int], None],
    also: Callable[[memoryview | bytes], object] | None = None,
) -> None:
    """Hash one unit of work from ``_work_items``; ``also`` gets the bytes the item covers, in order."""
    if item.last - item.first == 1 and item.size > files.sizes.small_span:
        digests[item.first] = _hash_span(spans[item.first], files, report, also=also)
        return
    with files.block(item, spans) as block:
        if also is not None:
            also(block)
        base, new_hasher = item.start, blake3.blake3  # a local name: looked up once, not once per span
        digests[item.first : item.last] = [
            DIGEST_PREFIX + new_hasher(block[span.start - base : span.end - base]).hexdigest()
            for span in spans[item.first : item.last]
        ]
    report(item.size)


def _run_parallel(items: Sequence[_T], work: Callable[[_T], None], workers: int) -> None:
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
        if also is None:
            hasher.update(piece)
        else:  # both hashers on each cache-sized part in turn: the second reads it from the cache
            for at in range(0, len(piece), CACHED_BYTES):
                part = piece[at : at + CACHED_BYTES]
                hasher.update(part)
                also(part)
        report(len(piece))
    return DIGEST_PREFIX + hasher.hexdigest()


class _Files:
    """Open files (and their maps) shared by all workers, closed together at the end.

    A file below an ``s3://`` prefix is an object read by ranged GETs (``sources``):
    never mapped, always read into the worker's buffer.
    """

    def __init__(self, use_mmap: bool, sizes: ReadSizes) -> None:
        self._use_mmap = use_mmap
        self.sizes = sizes
        self._lock = threading.Lock()
        self._open: dict[str, tuple[Source, mmap.mmap | None]] = {}
        self._buffers: dict[int, bytearray] = {}  # one read buffer per thread (by thread id)

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for source, mapping in self._open.values():
            if mapping is not None:
                with contextlib.suppress(BufferError):  # a worker that failed may still hold a view
                    mapping.close()
            source.close()
        self._open.clear()

    def size(self, span: Span) -> int:
        """The size of the span's file, as ``fstat`` (or the listing) saw it when it was opened."""
        return self._get(span)[0].size

    def pieces(self, span: Span) -> Iterator[memoryview | bytes]:
        """The span's bytes, in pieces of at most ``CHUNK_BYTES`` (mapped) or ``sizes.buffer`` (read)."""
        source, mapping = self._get(span)
        _check_within(span.label, source.size, span.end)
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
            want = min(self.sizes.buffer, span.end - offset)
            view = memoryview(buffer)[:want]
            got = source.read_into(view, offset)
            yield view[:got]
            offset += got

    @contextlib.contextmanager
    def block(self, item: _WorkItem, spans: Sequence[Span]) -> Iterator[memoryview]:
        """The bytes ``[item.start, item.end)`` of the item's file (at most ``sizes.buffer``) in one view."""
        first = spans[item.first]
        source, mapping = self._get(first)
        if item.end > source.size:  # the file shrank since it was measured: name the first span it cut
            short = next(span for span in spans[item.first : item.last] if span.end > source.size)
            _check_within(short.label, source.size, short.end)
        if mapping is not None:
            view = memoryview(mapping)[item.start : item.end]
        else:
            view = memoryview(self._buffer())[: item.end - item.start]
            filled = 0
            while filled < len(view):
                filled += source.read_into(view[filled:], item.start + filled)
        try:
            yield view
        finally:
            view.release()

    def _get(self, span: Span) -> tuple[Source, mmap.mmap | None]:
        with self._lock:
            entry = self._open.get(span.path)
            if entry is None:
                entry = self._open[span.path] = self._open_file(span)
            return entry

    def _open_file(self, span: Span) -> tuple[Source, mmap.mmap | None]:
        source = open_source(span.path, span.name, span.expect)
        if not (self._use_mmap and isinstance(source, LocalFile) and source.size > 0):
            return source, None
        try:
            mapping = mmap.mmap(source.fd, 0, access=mmap.ACCESS_READ)
            if hasattr(mapping, "madvise"):
                mapping.madvise(mmap.MADV_SEQUENTIAL)
        except (OSError, ValueError) as error:
            source.close()
            raise CkptpubError(
                f"{span.name}: cannot map: {getattr(error, 'strerror', None) or error}"
            ) from None
        return source, mapping

    def _buffer(self) -> bytearray:
        thread = threading.get_ident()
        with self._lock:
            buffer = self._buffers.get(thread)
            if buffer is None:
                buffer = self._buffers[thread] = bytearray(self.sizes.buffer)
            return buffer


def _check_within(name: str, size: int, end: int) -> None:
    """Refuse to hash up to ``end`` in a file of ``size`` bytes (it shrank since it was measured)."""
    if end > size:
        raise CkptpubError(f"{name}: file is {size} bytes, shorter than expected ({end})")
