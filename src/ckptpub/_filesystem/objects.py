"""Checkpoints in object storage (``s3://bucket/prefix``): a folder's reads and writes as S3 requests.

An S3 prefix is read as a folder is: its objects listed once (the scan), each
manifest, config or header fetched with its size bounded before the body is read,
and tensors hashed from ranged GETs into each hashing worker's reused buffer, so memory
stays ``threads * OBJECT_READ_BYTES`` whatever the checkpoint's size. Every ranged
GET of a listed object carries ``If-Match`` with the ETag the listing saw: an object
replaced while it is read is refused, never hashed half old and half new (the
object-store twin of ``safe_open``'s "the file the scan saw").

**Why boto3** (not fsspec with s3fs): it is the AWS SDK every other tool a user runs
is configured through (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, the default credential
chain, ``~/.aws/config``), its requests are plain synchronous calls that the
hashing engine's threads already parallelise (s3fs runs an asyncio loop of its own
behind them and adds a cache layer that hides what is requested), and it exposes
S3's conditional writes (``IfNoneMatch``, ``IfMatch``) that publishing needs.
Google Cloud Storage speaks the same protocol through its XML endpoint
(``AWS_ENDPOINT_URL=https://storage.googleapis.com`` with HMAC keys), so ``s3://``
serves it; ``gs://`` and ``az://`` are refused with that advice rather than half
supported. boto3 is imported only when a URL is used (``pip install ckptpub[s3]``).

Every request has a time-out and bounded retries (botocore's ``standard`` mode:
throttling and 5xx are retried with backoff); a failure ends in one line naming the
object (``CkptpubError``, exit 2): no credentials, no bucket, access denied,
throttled, unreachable.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._format.manifest import is_safe_relative_path
from ..errors import CkptpubError
from .safe_open import FileId

SCHEME = "s3://"
#: Schemes of other object stores: refused in one line (``ObjectUrl.parse``) rather than taken for paths.
OTHER_SCHEMES = ("gs://", "gcs://", "az://", "abfs://", "abfss://", "oss://", "r2://")
#: Attempts per request (botocore's ``standard`` retry mode: throttling, 5xx, dropped connections).
MAX_ATTEMPTS = 5
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
#: Ranged GETs in flight at once by default: object stores serve a prefix fastest with many.
READ_THREADS = 16
#: The largest ranged GET (and each hashing worker's buffer): neighbouring tensors are read together up
#: to this, a large one in pieces of it. Memory: ``READ_THREADS * OBJECT_READ_BYTES`` (256 MiB).
OBJECT_READ_BYTES = 16 << 20
#: A listing with more objects than this is refused, as ``scan.MAX_FILES`` refuses a folder.
MAX_OBJECTS = 200_000
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "503"})
_DENIED = frozenset({"AccessDenied", "403", "AllAccessDisabled", "AccountProblem"})
_BAD_CREDENTIALS = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"})
_ABSENT = frozenset({"NoSuchKey", "404", "NotFound"})
_CHANGED = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})


def is_object_url(path: str) -> bool:
    """Whether ``path`` names object storage (``s3://``, or another store's scheme, which is refused)."""
    return path.startswith(SCHEME) or path.startswith(OTHER_SCHEMES)


@dataclass(frozen=True)
class ObjectUrl:
    """``s3://bucket/key``: a prefix (a checkpoint "folder", no trailing slash) or one object."""

    bucket: str
    key: str

    @classmethod
    def parse(cls, text: str) -> ObjectUrl:
        """``text`` as a URL; ``CkptpubError`` for another store's scheme or an unusable bucket or key."""
        if not text.startswith(SCHEME):
            scheme = text.partition("://")[0]
            raise CkptpubError(
                f"{text}: {scheme}:// is not read directly; ckptpub reads S3's protocol (s3://), "
                "which Google Cloud Storage serves too "
                "(AWS_ENDPOINT_URL=https://storage.googleapis.com, HMAC keys), "
                "or mount the bucket and give the mounted folder"
            )
        bucket, _, key = text[len(SCHEME) :].partition("/")
        key = key.strip("/")
        if not bucket or not bucket.replace("-", "").replace(".", "").replace("_", "").isalnum():
            raise CkptpubError(f"{text}: not an s3://BUCKET/PREFIX URL")
        if key and not is_safe_relative_path(key):
            raise CkptpubError(f"{text}: the prefix has an empty, '.' or '..' part")
        return cls(bucket, key)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def child(self, relative: str) -> ObjectUrl:
        """The object ``relative`` (a '/'-separated path) below this prefix."""
        return ObjectUrl(self.bucket, f"{self.key}/{relative}" if self.key else relative)

    @property
    def name(self) -> str:
        """The last part of the key: what ``os.path.basename`` is to a path."""
        return self.key.rpartition("/")[2]


class ObjectEntry(NamedTuple):
    """An object below a prefix, as the listing saw it: its path below the prefix, size and ETag."""

    path: str
    size: int
    etag: str


class ObjectAbsentError(CkptpubError):
    """Nothing at that key (the bucket exists)."""


def list_objects(prefix: ObjectUrl) -> list[ObjectEntry]:
    """Every object below ``prefix`` (ListObjectsV2, 1,000 a request), in the listing's (key) order.

    Zero-byte keys ending in ``/`` (the "folders" consoles create) are left out. A key
    whose path below the prefix has an empty, ``.`` or ``..`` part could not be a file
    of a folder, and makes the prefix unusable rather than being skipped.
    """
    start = f"{prefix.key}/" if prefix.key else ""
    entries: list[ObjectEntry] = []
    with _requests(str(prefix)):
        pages = _client().get_paginator("list_objects_v2").paginate(Bucket=prefix.bucket, Prefix=start)
        for page in pages:
            for item in page.get("Contents", ()):
                path, size = item["Key"][len(start) :], int(item["Size"])
                if path.endswith("/") and size == 0:
                    continue
                if not is_safe_relative_path(path):
                    raise CkptpubError(f"{prefix.child(path)}: a key with an empty, '.' or '..' part")
                entries.append(ObjectEntry(path, size, item["ETag"]))
            if len(entries) > MAX_OBJECTS:
                raise CkptpubError(f"{prefix}: more than {MAX_OBJECTS} objects; not a checkpoint")
    return entries


def object_versions(prefix: ObjectUrl) -> dict[str, str]:
    """Each current object's version id below ``prefix`` (``null`` where the bucket never versioned it)."""
    start = f"{prefix.key}/" if prefix.key else ""
    versions: dict[str, str] = {}
    with _requests(str(prefix)):
        pages = _client().get_paginator("list_object_versions").paginate(Bucket=prefix.bucket, Prefix=start)
        for page in pages:
            for item in page.get("Versions", ()):
                if item.get("IsLatest"):
                    versions[item["Key"][len(start) :]] = str(item.get("VersionId") or "null")
    return versions


def read_small(
    url: ObjectUrl, limit: int, display_name: str, etag: str | None = None, *, limit_name: str = "limit"
) -> bytes:
    """A whole small object, refused before its body is read when it is over ``limit`` bytes.

    With ``etag``, only that version of the object is read. ``ObjectAbsentError``
    when nothing is at the key.
    """
    with _requests(display_name):
        response = _client().get_object(Bucket=url.bucket, Key=url.key, **_if_match(etag))
        with contextlib.closing(response["Body"]) as body:
            size = int(response["ContentLength"])
            if size > limit:
                raise CkptpubError(f"{display_name}: {size} bytes is over the {limit}-byte {limit_name}")
            data: bytes = body.read(limit + 1)
    if len(data) != size:
        raise CkptpubError(f"{display_name}: {len(data)} bytes arrived of the {size} the store announced")
    return data


def stat_object(url: ObjectUrl, display_name: str) -> ObjectEntry:
    """One object's size and ETag (a HEAD request); ``ObjectAbsentError`` when nothing is there."""
    with _requests(display_name):
        head = _client().head_object(Bucket=url.bucket, Key=url.key)
    return ObjectEntry(url.name, int(head["ContentLength"]), head["ETag"])


class ObjectFile:
    """One object opened for ranged reads of the bytes the listing saw (its ``etag``)."""

    def __init__(self, url: ObjectUrl, display_name: str, size: int, etag: str) -> None:
        self.url, self.display_name, self.size, self.etag = url, display_name, size, etag

    def close(self) -> None:
        """Nothing to release: each read is its own request (the client's connection pool is shared)."""

    def read_into(self, view: memoryview, offset: int) -> int:
        """Fill ``view`` with the bytes from ``offset`` (one ranged GET); how many arrived (all of them).

        A connection dropped mid-body is retried like a failed request, at most
        ``MAX_ATTEMPTS`` times in all.
        """
        wanted = f"bytes={offset}-{offset + len(view) - 1}"
        for attempt in range(1, MAX_ATTEMPTS + 1):
            with _requests(self.display_name, changed="changed while it was being read"):
                response = _client().get_object(
                    Bucket=self.url.bucket, Key=self.url.key, Range=wanted, IfMatch=self.etag
                )
                try:
                    with contextlib.closing(response["Body"]) as body:
                        return _fill(body, view, self.display_name)
                except _dropped_connection() as error:
                    if attempt == MAX_ATTEMPTS:
                        raise CkptpubError(
                            f"{self.display_name}: the connection dropped {attempt} times "
                            f"while reading: {error}"
                        ) from None
        raise AssertionError("unreachable")  # the loop returns or raises


def open_object(url: ObjectUrl, display_name: str, expect: FileId | None) -> ObjectFile:
    """The object at ``url`` for ranged reads: the listing's ``(etag, size)`` as ``expect``, or a HEAD."""
    if expect is not None:
        etag, size = expect
        return ObjectFile(url, display_name, int(size), str(etag))
    entry = stat_object(url, display_name)
    return ObjectFile(url, display_name, entry.size, entry.etag)


def put_object(url: ObjectUrl, data: bytes, *, replaces: str | None, display_name: str) -> str:
    """Write ``data`` at ``url`` only if the object is still what the caller saw; return its new ETag.

    ``replaces`` is the ETag of the object the caller read (S3's ``If-Match``), or
    None when the caller saw nothing there (``If-None-Match: *``): of two writers
    that saw the same state, exactly one succeeds, and the other is refused.
    """
    condition = {"IfNoneMatch": "*"} if replaces is None else {"IfMatch": replaces}
    with _requests(
        display_name, changed="written by someone else meanwhile; nothing was written, publish again"
    ):
        response = _client().put_object(Bucket=url.bucket, Key=url.key, Body=data, **condition)
    return str(response["ETag"])


def _if_match(etag: str | None) -> dict[str, str]:
    return {} if etag is None else {"IfMatch": etag}


def _fill(body: Any, view: memoryview, display_name: str) -> int:
    filled = 0
    while filled < len(view):
        got = body.readinto(view[filled:])
        if not got:
            raise CkptpubError(f"{display_name}: the object ended {len(view) - filled} bytes early")
        filled += got
    return filled


def _dropped_connection() -> tuple[type[BaseException], ...]:
    """The errors of a body that stopped arriving (the request itself is retried by botocore)."""
    exceptions = _botocore_exceptions()
    return (
        exceptions.IncompleteReadError,
        exceptions.ReadTimeoutError,
        exceptions.ResponseStreamingError,
        ConnectionError,
    )


#: The environment variables boto3 builds a client from (endpoint, profile, credentials, region, files).
CLIENT_ENVIRONMENT = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
_client_lock = threading.Lock()
_clients: dict[tuple[str | None, ...], Any] = {}


def _client() -> Any:
    """The S3 client for the environment as it is now: made once per configuration (boto3 clients are
    thread-safe; making one is not, and costs 50 ms), and made again when ``AWS_*`` settings change,
    so a process that points at another store or account never reaches it with an old client."""
    configuration = tuple(os.environ.get(name) for name in CLIENT_ENVIRONMENT)
    with _client_lock:
        client = _clients.get(configuration)
        if client is None:
            client = _clients[configuration] = _new_client()
        return client


def _new_client() -> Any:
    _botocore_exceptions()  # boto3 is installed
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_pool_connections=READ_THREADS * 2,
    )
    with _requests("AWS configuration"):  # a profile that does not exist, a malformed ~/.aws/config
        return boto3.session.Session().client("s3", config=config)


@contextlib.contextmanager
def _requests(display_name: str, *, changed: str = "changed while it was being read") -> Iterator[None]:
    """botocore's failures as one line naming ``display_name`` (``ObjectAbsentError`` for a missing key)."""
    exceptions = _botocore_exceptions()
    try:
        yield
    except exceptions.NoCredentialsError:
        raise CkptpubError(
            f"{display_name}: no AWS credentials found (AWS_PROFILE, AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or the machine's role)"
        ) from None
    except exceptions.ClientError as error:
        raise _client_error(error, display_name, changed) from None
    except exceptions.BotoCoreError as error:
        raise CkptpubError(f"{display_name}: {error}") from None


def _botocore_exceptions() -> Any:
    """``botocore.exceptions``; a one-line ``CkptpubError`` saying how to install boto3 when it is missing."""
    try:
        from botocore import exceptions
    except ImportError:
        raise CkptpubError(
            "s3:// URLs are read with boto3, which is not installed: pip install 'ckptpub[s3]'"
        ) from None
    return exceptions


def _client_error(error: Any, display_name: str, changed: str) -> CkptpubError:
    details = error.response.get("Error", {})
    code = str(details.get("Code") or error.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    if code == "NoSuchBucket":
        return CkptpubError(f"{display_name}: no such bucket ({details.get('BucketName') or 'as named'})")
    if code in _ABSENT:
        return ObjectAbsentError(f"{display_name}: no such object")
    if code in _DENIED:
        return CkptpubError(f"{display_name}: access denied by the object store ({code})")
    if code in _BAD_CREDENTIALS:
        return CkptpubError(f"{display_name}: the object store refused these credentials ({code})")
    if code in _THROTTLED:
        return CkptpubError(
            f"{display_name}: throttled by the object store after {MAX_ATTEMPTS} attempts ({code}); "
            "try again later or with fewer --threads"
        )
    if code in _CHANGED:
        return CkptpubError(f"{display_name}: {changed}")
    message = details.get("Message") or "no message"
    return CkptpubError(f"{display_name}: the object store answered {code}: {message}")
