"""A real S3-compatible server (moto's) for every test in this folder: started once per session."""

from __future__ import annotations

from support.s3fixtures import bucket, s3_server

__all__ = ["bucket", "s3_server"]
