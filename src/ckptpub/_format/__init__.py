"""The format layer: bytes to validated data and back, with no file system and no I/O.

What ``ckptpub.json`` is (``docs/format.md``) and the encodings it builds on. Nothing
here opens a file: readers above hand it bytes they read within their bounds.

Modules (imports go downwards only; from outside this package only ``ckptpub.errors``):

    manifest      the ``Manifest`` type: parse and check ckptpub/3 (older formats refused), encode, identity
    regions       ckptpub/3's two JSON regions: one canonical entry per line, decoded column by column
    records       what the regions decode to: checked columns (``Decoded``), tensor and file records, tiling
    config_meaning  which config keys the identity counts (``INERT``: what it leaves out)
    safetensors   a safetensors header's bytes (or a whole file in memory) to a checked ``ShardLayout``;
                  ``header_length``, ``DTYPE_BITS``
    strict_json   ``loads_strict``: JSON with duplicate keys, NaN, 1e400 and lone surrogates refused
    canonical     canonical JSON (RFC 8785): one byte sequence per value, so digests are stable
    digest        ``blake3:<64 hex>``: ``DIGEST_PREFIX`` and ``digest_bytes``
    names         every file name ckptpub reads or writes (manifest, signature, run index, ...)
"""
