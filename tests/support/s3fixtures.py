"""The S3 server fixtures of every test folder that needs a bucket (``tests/objects``, ``tests/vllm``).

A folder's ``conftest.py`` imports them (``from support.s3fixtures import bucket, s3_server``), so
one definition serves both; pytest then runs one server per session (per xdist worker) for each
folder that asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .s3server import S3Server, running_s3_server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The server, with this process's environment pointed at it (ckptpub's in-process client too)."""
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with running_s3_server(log) as server, pytest.MonkeyPatch.context() as patch:
        for name, value in server.env.items():
            patch.setenv(name, value)
        yield server


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    """An empty bucket of its own for one test."""
    return s3_server.new_bucket()
