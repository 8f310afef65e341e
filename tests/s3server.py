"""A throwaway S3-compatible endpoint on 127.0.0.1 for tests (moto's server in a subprocess).

Why a real server and not ``moto.mock_aws``: Tune writes through pyarrow's C++ S3 client and
from Ray worker processes, neither of which an in-process Python mock can intercept. A server
on loopback is reachable from every process on the machine, as S3 is from every node.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's S3 server on a free loopback port, with one bucket, for one test or session.

    Use as ``with S3Server() as s3: ...``; give ``s3.env`` to every process that must reach it
    (the Tune driver and the Ray nodes whose trials upload checkpoints).
    """

    def __init__(self, bucket: str = "lcfed-test", region: str = "us-east-1", startup_timeout: float = 30.0):
        self.bucket = bucket
        self.region = region
        self.startup_timeout = startup_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What boto3 and pyarrow (>= 15: it reads ``AWS_ENDPOINT_URL``, scheme included) need to
        use this endpoint over plain http. Dummy keys: moto accepts any, and setting them stops
        the SDKs from probing the EC2 metadata service for credentials (slow timeouts)."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    def uri(self, path: str = "") -> str:
        """``s3://bucket/path``; with ``env`` applied, Tune and pyarrow need nothing in the URI."""
        path = path.strip("/")
        return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"

    def client(self) -> Any:
        """A boto3 S3 client for this endpoint (boto3 comes with ``moto[server]``)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def list(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` in the bucket (paginated), sorted."""
        keys: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return sorted(keys)

    def start(self) -> S3Server:
        """Start the server in its own process group (so ``stop`` can end it and its children
        without touching anything else), wait until it answers, and create the bucket."""
        deadline = time.monotonic() + self.startup_timeout
        while True:  # a probed free port can be taken before moto binds it: try another
            self.port = _free_port()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "NO_PROXY": "127.0.0.1,localhost"},
            )
            if self._wait_ready(deadline):
                break
            self.stop()
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto S3 server did not answer within {self.startup_timeout} s")
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def _wait_ready(self, deadline: float) -> bool:
        assert self._proc is not None
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                opener.open(self.endpoint + "/", timeout=2).close()
                return True
            except urllib.error.HTTPError:
                return True  # any HTTP answer means it is serving
            except OSError:
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        """Kill the server's process group (only ours) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        else:
            proc.wait()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
