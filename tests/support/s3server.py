"""A real S3-compatible server on 127.0.0.1 for the tests: moto's standalone server (``moto_server``).

It speaks S3's HTTP protocol (ranged GET, ListObjectsV2, conditional puts, versioning),
so ckptpub's own boto3 client, and runai-model-streamer's, reach it exactly as they
reach AWS: through ``AWS_ENDPOINT_URL`` and the usual credential variables, which
``env`` returns (for subprocesses, and for the test process through ``monkeypatch``). One
server per test session (per xdist worker), started on a free port, stopped at the end.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 30
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_ABSOLUTE = re.compile(r" https?://[^/ ]+/")


class S3Server:
    """A running ``moto_server``: its endpoint, the environment that reaches it, a boto3 client."""

    def __init__(self, log_path: Path, unauthenticated_requests: int | None = None) -> None:
        """``unauthenticated_requests``: with a number, the server checks credentials and IAM policies
        (moto's ``INITIAL_NO_AUTH_ACTION_COUNT``) after that many requests, which set it up."""
        executable = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        if executable is None:
            raise RuntimeError(
                "moto_server is not installed beside this Python (make setup installs moto[server])"
            )
        with socket.socket() as probe:  # a free port; moto binds it a moment later
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        self._log = open(log_path, "wb")  # noqa: SIM115  # closed in stop()
        env = dict(os.environ)
        if unauthenticated_requests is not None:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(unauthenticated_requests)
        self._process = subprocess.Popen(
            [executable, "-H", "127.0.0.1", "-p", str(port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.log_path = log_path
        self._wait_until_up()

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to reach this server, and nothing real."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def client(self, service: str = "s3"):  # noqa: ANN201  # boto3's client types are made at run time
        import boto3

        return boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def new_bucket(self, *, versioned: bool = False) -> str:
        """A fresh bucket (one per test: tests never see each other's objects)."""
        name = f"ckpt-{uuid.uuid4().hex[:12]}"
        client = self.client()
        client.create_bucket(Bucket=name)
        if versioned:
            client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    def upload(self, folder: Path, url: str) -> str:
        """Every file below ``folder`` uploaded under ``s3://bucket/prefix`` (``url``); returns ``url``."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        client = self.client()
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
        return url

    def requests_logged(self) -> list[str]:
        """The request lines the server logged so far (``GET /bucket/key?... HTTP/1.1``), oldest first.

        The server colours some lines (a 206 answer to a ranged GET) and logs a request made in
        absolute form (runai-model-streamer's ``GET http://host:port/bucket/key``) as it came: both are
        written here as every other line is.
        """
        text = _COLOUR.sub("", self.log_path.read_text(errors="replace"))
        lines = [line.split('"')[1] for line in text.splitlines() if line.count('"') >= 2]
        return [_ABSOLUTE.sub(" /", line, count=1) for line in lines]

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto_server exited at start: {self.log_path.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1),
            ):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto_server did not answer within {START_TIMEOUT_S} s")


@contextlib.contextmanager
def running_s3_server(log_path: Path, unauthenticated_requests: int | None = None) -> Iterator[S3Server]:
    server = S3Server(log_path, unauthenticated_requests)
    try:
        yield server
    finally:
        server.stop()


class SlowProxy:
    """A stand-in for a distant store: forwards every request to ``upstream`` after waiting ``latency_s``.

    Point a client's ``AWS_ENDPOINT_URL`` at ``endpoint``: each request pays one round trip
    of latency, as from a node to a region's object store, and is counted (``requests``).
    Requests are served in parallel, each waiting on its own (``ThreadingHTTPServer``).
    """

    def __init__(self, upstream: str, latency_s: float) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        proxy = self

        class Forward(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                time.sleep(latency_s)
                with proxy._lock:
                    proxy.requests += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                connection = http.client.HTTPConnection(host, int(port), timeout=120)
                try:
                    connection.request(self.command, self.path, body=body, headers=dict(self.headers))
                    answer = connection.getresponse()
                    data = answer.read()
                finally:
                    connection.close()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward  # noqa: N815  # http.server's names

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._lock = threading.Lock()
        self.requests = 0
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
