"""The hashing engine: BLAKE3 digests of byte ranges of files, in this process or over a job's ranks.

It knows nothing about manifests or checkpoints: callers hand it ``Span`` s (a file and
a byte range) and get one digest per span.

Modules (imports go downwards only; from outside this package only ``_filesystem``,
``_format`` and ``errors``):

    distributed   ``DistributedHasher``: the spans of a folder hashed by every rank of a torch job
    ranks         which rank hashes what, engine-neutral (no torch): the exchange of byte rows, the
                  agreement, the assignment, the same-file rule (``storage_fingerprint``), the plan
    options       ``HashOptions`` (threads, mmap, progress, who hashes) and the ``SpanHasher`` protocol
    engine        ``hash_spans``, ``hash_files`` (and each file's SHA-256 or BLAKE3): threads, mmap, batching
"""
