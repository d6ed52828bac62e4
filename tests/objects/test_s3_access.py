"""Credentials the store refuses, and a user it denies, against a real S3 server that checks them.

A second moto server checks every request's signature and the user's IAM policy once its
first three requests (the set-up: a bucket, a user, that user's key) are done; the
``ckptpub`` commands are real subprocesses with boto3's default credential chain.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.checkpoints import run_cli
from support.s3server import S3Server, running_s3_server

SETUP_REQUESTS = 3  # create the bucket, the user and the user's access key


@pytest.fixture(scope="module")
def checking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, dict[str, str]]]:
    """The server, and the credentials of a user with no policy at all (every request is denied)."""
    log = tmp_path_factory.mktemp("moto-auth") / "moto_server.log"
    with running_s3_server(log, unauthenticated_requests=SETUP_REQUESTS) as server:
        server.client().create_bucket(Bucket="locked")
        iam = server.client("iam")
        iam.create_user(UserName="nobody")
        key = iam.create_access_key(UserName="nobody")["AccessKey"]
        denied = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        yield server, denied


@pytest.mark.parametrize("command", ["show", "verify", "publish", "ls"])
def test_a_user_the_store_denies_gets_one_line_exit_2(checking_server, command):
    server, denied = checking_server
    result = run_cli(command, "s3://locked/m", env={**server.env, **denied})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ckptpub: error: s3://locked/m")
    assert lines[0].endswith("access denied by the object store (AccessDenied)")


@pytest.mark.parametrize("command", ["show", "verify", "publish", "ls"])
def test_credentials_the_store_does_not_know_get_one_line_exit_2(checking_server, command):
    server, _ = checking_server
    unknown = {"AWS_ACCESS_KEY_ID": "AKIAUNKNOWN000000000", "AWS_SECRET_ACCESS_KEY": "wrong"}
    result = run_cli(command, "s3://locked/m", env={**server.env, **unknown})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].endswith("the object store refused these credentials (InvalidAccessKeyId)")
