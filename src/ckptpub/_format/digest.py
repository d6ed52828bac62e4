"""The ckptpub digest: ``blake3:`` and the 64 lowercase hex digits of BLAKE3 over some bytes.

Every digest a manifest holds (tensors, files, configs, the identity) has this one
form. Hashing the bytes of files fast is the hashing engine's job (``_hashing``);
this module is the digest of bytes already in memory, which the format itself needs
(an identity is the digest of a canonical document).
"""

from __future__ import annotations

import blake3

DIGEST_PREFIX = "blake3:"


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """The ckptpub digest (``"blake3:<64 hex>"``) of a bytes-like object.

    >>> digest_bytes(b"")
    'blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262'
    """
    return DIGEST_PREFIX + blake3.blake3(data).hexdigest()
