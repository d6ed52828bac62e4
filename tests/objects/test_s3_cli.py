"""``ckptpub publish|verify|show|diff`` on ``s3://`` against a real S3 server (moto's, on 127.0.0.1).

Every command is a real ``ckptpub`` subprocess using boto3 over HTTP, configured as
users configure AWS tools (``AWS_ENDPOINT_URL`` and the credential variables); the
objects are uploaded by boto3 from real checkpoint folders written by safetensors.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.checkpoints import model_tensors, run_cli, tensor_range, write_checkpoint
from support.s3server import S3Server

import ckptpub
from ckptpub.errors import CkptpubError

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A two-shard checkpoint folder (unpublished)."""
    return write_checkpoint(tmp_path / "model", model_tensors(), shards=2)


@pytest.fixture
def in_bucket(s3_server: S3Server, bucket: str, model: Path) -> str:
    """The model uploaded to ``s3://bucket/run/step-1`` (unpublished)."""
    return s3_server.upload(model, f"s3://{bucket}/run/step-1")


def one_error_line(result: object) -> str:
    """The single ``ckptpub: error:`` line of a failed command (no traceback, nothing else)."""
    lines = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1, result.stderr  # type: ignore[attr-defined]
    assert lines[0].startswith("ckptpub: error: ")
    return lines[0]


def test_publish_in_the_bucket_gives_the_local_folders_identity(s3_server, in_bucket, model):
    published = run_cli("publish", in_bucket)
    assert published.returncode == 0, published.stderr
    local = ckptpub.publish(model)
    assert published.stdout.strip() == local.identity
    bucket, prefix = in_bucket.removeprefix("s3://").split("/", 1)
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"{prefix}/ckptpub.json" in keys

    shown = run_cli("show", "--json", in_bucket)
    summary = json.loads(shown.stdout)
    assert summary["identity"] == local.identity
    assert summary["folder"] == in_bucket
    listing = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]
    etags = {
        o["Key"].removeprefix(prefix + "/"): o["ETag"]
        for o in listing
        if not o["Key"].endswith("ckptpub.json")
    }
    storage = summary["provenance"]["storage"]
    assert storage["url"] == in_bucket
    assert {path: o["etag"] for path, o in storage["objects"].items()} == etags

    verified = run_cli("verify", in_bucket)
    assert verified.returncode == 0, verified.stderr
    assert f"OK, {len(etags)} files" in verified.stderr


def test_versions_go_into_provenance_not_identity(s3_server, model):
    versioned = s3_server.upload(model, f"s3://{s3_server.new_bucket(versioned=True)}/m")
    plain = s3_server.upload(model, f"s3://{s3_server.new_bucket()}/m")
    identities = [run_cli("publish", url).stdout.strip() for url in (versioned, plain)]
    assert identities[0] == identities[1] == ckptpub.publish(model).identity
    versions = {
        o["version"] for o in ckptpub.read_manifest(versioned).provenance["storage"]["objects"].values()
    }
    assert "null" not in versions
    assert len(versions) == 7
    assert {o["version"] for o in ckptpub.read_manifest(plain).provenance["storage"]["objects"].values()} == {
        "null"
    }


def test_a_changed_byte_in_one_object_is_named_by_tensor(s3_server, in_bucket, model):
    assert run_cli("publish", in_bucket).returncode == 0
    start, _ = tensor_range(model / SHARD, "model.embed_tokens.weight")
    bucket, prefix = in_bucket.removeprefix("s3://").split("/", 1)
    data = bytearray((model / SHARD).read_bytes())
    data[start + 10] ^= 0xFF
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/{SHARD}", Body=bytes(data))

    result = run_cli("verify", in_bucket)
    assert result.returncode == 1
    assert f"{SHARD}: FAILED (tensor 'model.embed_tokens.weight' bytes differ)" in result.stdout
    assert "FAILED, 1 problem (1 tensor changed)" in result.stderr


def test_diff_between_a_bucket_and_a_folder(in_bucket, model, tmp_path):
    assert run_cli("publish", in_bucket).returncode == 0
    ckptpub.publish(model)
    same = run_cli("diff", in_bucket, model)
    assert same.returncode == 0, same.stderr
    assert same.stdout.startswith("same identity")
    other = write_checkpoint(tmp_path / "other", model_tensors(seed=1), shards=2)
    ckptpub.publish(other)
    changed = run_cli("diff", in_bucket, other)
    assert changed.returncode == 1
    assert "tensors changed" in changed.stderr


def test_show_reads_one_object_and_nothing_else(s3_server, in_bucket):
    assert run_cli("publish", in_bucket).returncode == 0
    before = len(s3_server.requests_logged())
    assert run_cli("show", in_bucket).returncode == 0
    requests = s3_server.requests_logged()[before:]
    assert [r.split("?")[0] for r in requests] == [
        f"GET /{in_bucket.removeprefix('s3://')}/ckptpub.json HTTP/1.1"
    ]


def test_publish_again_replaces_its_own_manifest_and_a_rival_write_is_refused(s3_server, in_bucket):
    from ckptpub._filesystem.objects import ObjectUrl, put_object

    assert run_cli("publish", in_bucket).returncode == 0
    again = run_cli("publish", in_bucket)
    assert again.returncode == 0, again.stderr  # If-Match: the manifest it saw

    url = ObjectUrl.parse(in_bucket).child("rival.json")
    put_object(url, b"first", replaces=None, display_name=str(url))
    with pytest.raises(CkptpubError, match="written by someone else meanwhile; nothing was written"):
        put_object(url, b"second", replaces=None, display_name=str(url))  # both saw nothing there
    with pytest.raises(CkptpubError, match="written by someone else meanwhile"):
        put_object(url, b"third", replaces='"0123456789abcdef0123456789abcdef"', display_name=str(url))
    bucket, key = url.bucket, url.key
    assert s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read() == b"first"


def test_an_object_replaced_while_it_is_hashed_is_refused(s3_server, in_bucket, model):
    assert run_cli("publish", in_bucket).returncode == 0
    bucket, prefix = in_bucket.removeprefix("s3://").split("/", 1)
    replaced = []

    def replace_the_second_shard(done: int, total: int) -> None:
        if not replaced:  # another object at the key: the listing's ETag no longer names it
            body = (model / "model-00002-of-00002.safetensors").read_bytes()
            s3_server.client().put_object(
                Bucket=bucket,
                Key=f"{prefix}/model-00002-of-00002.safetensors",
                Body=body[:-1] + bytes([body[-1] ^ 1]),
            )
            replaced.append(done)

    with pytest.raises(
        CkptpubError, match=r"model-00002-of-00002\.safetensors: changed while it was being read"
    ):
        ckptpub.verify(in_bucket, threads=1, on_progress=replace_the_second_shard)


@pytest.mark.parametrize(
    ("url", "env", "expected"),
    [
        ("s3://no-such-bucket-here/m", {}, "no such bucket (no-such-bucket-here)"),
        ("gs://bucket/m", {}, "gs:// is not read directly; ckptpub reads S3's protocol (s3://)"),
        ("s3://bad bucket/m", {}, "not an s3://BUCKET/PREFIX URL"),
        (
            "{bucket}/m",
            {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
            "no AWS credentials found (AWS_PROFILE, AWS_ACCESS_KEY_ID",
        ),
        ("{bucket}/m", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "Could not connect to the endpoint URL"),
        ("{bucket}/m", {"AWS_PROFILE": "nobody"}, "The config profile (nobody) could not be found"),
        ("{bucket}/absent", {}, "{bucket}/absent: no ckptpub.json; run 'ckptpub publish' on it first"),
    ],
    ids=["no-bucket", "gs", "bad-url", "no-credentials", "unreachable", "no-profile", "no-manifest"],
)
@pytest.mark.parametrize("command", ["show", "verify", "publish"])
def test_object_store_failures_are_one_line_exit_2(command, url, env, expected, in_bucket):
    bucket = in_bucket.removeprefix("s3://").split("/")[0]
    url = url.replace("{bucket}", f"s3://{bucket}")
    expected = expected.replace("{bucket}", f"s3://{bucket}")
    if command == "publish" and expected.endswith("publish' on it first"):
        expected = f"s3://{bucket}/absent: is empty"
    started = time.monotonic()
    result = run_cli(command, url, env=env, timeout=100)
    assert result.returncode == 2
    assert expected in one_error_line(result)
    assert time.monotonic() - started < 60


def test_a_key_no_folder_could_hold_is_refused(s3_server, in_bucket):
    bucket, prefix = in_bucket.removeprefix("s3://").split("/", 1)
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/extra//double.txt", Body=b"x")
    result = run_cli("publish", in_bucket)
    assert result.returncode == 2
    assert "extra//double.txt: a key with an empty, '.' or '..' part" in one_error_line(result)


class _Throttling(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that answers every request with 503 SlowDown, as S3 does under load."""

    requests = 0

    def _slow_down(self) -> None:
        type(self).requests += 1
        body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802  # http.server's names
        self._slow_down()

    def do_HEAD(self) -> None:  # noqa: N802
        self._slow_down()

    def do_PUT(self) -> None:  # noqa: N802
        self._slow_down()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def throttling_endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Throttling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_throttling_is_retried_a_bounded_number_of_times_then_one_line(throttling_endpoint, s3_server):
    _Throttling.requests = 0
    result = run_cli("show", "s3://busy/m", env={"AWS_ENDPOINT_URL": throttling_endpoint}, timeout=100)
    assert result.returncode == 2
    assert "throttled by the object store after 5 attempts (SlowDown)" in one_error_line(result)
    assert _Throttling.requests == 5


def test_a_manifest_over_the_limit_is_refused_before_its_body_is_read(s3_server, in_bucket):
    bucket, prefix = in_bucket.removeprefix("s3://").split("/", 1)
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/ckptpub.json", Body=b" " * ((64 << 20) + 1))
    result = run_cli("show", in_bucket)
    assert result.returncode == 2
    assert "ckptpub.json: 67108865 bytes is over the 67108864-byte manifest limit" in one_error_line(result)


def test_the_library_follows_the_environment_it_is_called_in(in_bucket, monkeypatch):
    """One process, two configurations: a client made for one store never answers for another."""
    assert run_cli("publish", in_bucket).returncode == 0
    identity = ckptpub.read_manifest(in_bucket).identity  # a client for the test server
    with monkeypatch.context() as patch:
        patch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
        with pytest.raises(CkptpubError, match="Could not connect to the endpoint URL"):
            ckptpub.read_manifest(in_bucket)
    assert ckptpub.read_manifest(in_bucket).identity == identity
