"""How an operation asks for hashing: one ``HashOptions`` value, checked once where the public API takes it.

``publish``, ``build_manifest``, ``verify`` and ``verify_signed`` take the same four
keywords (``threads``, ``use_mmap``, ``on_progress``, ``hasher``); each turns them into
one ``HashOptions`` at its boundary, and that value is what travels inside. Its two
methods are the two questions an operation asks: ``span_digests`` (the BLAKE3 digest
of each span) and ``file_digests`` (those, and the SHA-256 or BLAKE3 of each whole file,
for a signature). ``hasher`` says who answers them: this process's threads (None: the
``engine``), or a ``SpanHasher`` such as ``distributed.DistributedHasher`` (every rank
of a job).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import CkptpubError
from .engine import FileDigests, ProgressCallback, Span, hash_files, hash_spans


@runtime_checkable
class SpanHasher(Protocol):
    """Hashes spans somewhere other than this process's threads alone (``distributed.DistributedHasher``).

    Both methods return exactly what ``engine.hash_spans`` / ``engine.hash_files``
    return for the same spans; ``options`` carries the knobs for the local share.
    """

    def span_digests(self, spans: Sequence[Span], options: HashOptions) -> list[str]: ...

    def file_digests(self, spans: Sequence[Span], algorithm: str, options: HashOptions) -> FileDigests: ...


@dataclass(frozen=True)
class HashOptions:
    """The hashing knobs of one operation (see ``engine`` for what each costs)."""

    threads: int | None = None  # None: one per CPU
    use_mmap: bool = True  # False: pread into a bounded buffer (spinning disks, some network file systems)
    on_progress: ProgressCallback | None = None  # on_progress(done_bytes, total_bytes)
    hasher: SpanHasher | None = None  # None: this process's threads

    @classmethod
    def checked(cls, threads: Any, use_mmap: Any, on_progress: Any, hasher: Any) -> HashOptions:
        """The options from a public function's keywords; ``CkptpubError`` for one it cannot use."""
        if threads is not None and (type(threads) is not int or threads < 1):
            raise CkptpubError(f"threads: expected a positive int or None, got {threads!r}")
        if on_progress is not None and not callable(on_progress):
            raise CkptpubError(f"on_progress: expected a callable, got {type(on_progress).__name__}")
        if hasher is not None and not isinstance(hasher, SpanHasher):
            raise CkptpubError(
                f"hasher: expected a SpanHasher such as ckptpub.distributed.DistributedHasher, "
                f"got {type(hasher).__name__}"
            )
        return cls(threads, bool(use_mmap), on_progress, hasher)

    def span_digests(self, spans: Sequence[Span]) -> list[str]:
        """The BLAKE3 digest of each span, in order."""
        if self.hasher is not None:
            return self.hasher.span_digests(spans, self)
        return hash_spans(spans, threads=self.threads, use_mmap=self.use_mmap, on_progress=self.on_progress)

    def file_digests(self, spans: Sequence[Span], algorithm: str) -> FileDigests:
        """Each span's digest and each whole file's ``algorithm`` digest (``engine.FILE_HASHES``), from
        one read (spans tiling each file)."""
        if self.hasher is not None:
            return self.hasher.file_digests(spans, algorithm, self)
        return hash_files(
            spans, algorithm, threads=self.threads, use_mmap=self.use_mmap, on_progress=self.on_progress
        )
