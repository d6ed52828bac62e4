"""The format layer: bytes to validated data and back, with no file system and no I/O.

What ``ckptpub.json`` is (``docs/format.md``) and the encodings it builds on. Nothing
here opens a file: readers above hand it bytes they read within their bounds.

Modules (imports go downwards only; from outside this package only ``ckptpub.errors``):

    manifest      the ``Manifest`` type: parse and validate ckptpub/2 and /1, encode, identity
    tables        ckptpub/2's two text tables: one line per tensor, decoded column by column
    safetensors   a safetensors header's bytes to a checked ``ShardLayout``; ``DTYPE_BITS``
    strict_json   ``loads_strict``: JSON with duplicate keys, NaN, 1e400 and lone surrogates refused
    canonical     canonical JSON (RFC 8785): one byte sequence per value, so digests are stable
    digest        ``blake3:<64 hex>``: ``DIGEST_PREFIX`` and ``digest_bytes``
"""
