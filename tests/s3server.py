"""A real S3-protocol server for tests and benches: moto in server mode, one subprocess on a free
loopback port (the emulator s3fs's own suite runs against), and helpers to fill it.

    server = MotoServer().start()       # server.url: http://127.0.0.1:PORT
    upload_folder(server, "bucket", local_root, "train")
    key, secret = enable_auth(server)   # from now on only (key, secret) is accepted
    server.kill()                       # SIGKILL (the store going away); server.stop(): SIGTERM

Not a library module: coordl never imports it (tests/objstore/conftest.py and bench/objstore.py do).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

#: Credentials of a server without auth (moto accepts anything until enable_auth).
TEST_KEY, TEST_SECRET, REGION = "testing-key-id", "testing-secret", "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_child(proc: subprocess.Popen | None) -> None:
    """A server the tests started: SIGTERM and wait, SIGKILL after 10 s; reaped."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class MotoServer:
    """`python -m moto.server` on 127.0.0.1, a child of this process; state lives in its memory."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> MotoServer:
        for _ in range(5):
            self.port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=2):
                        return self
                except OSError:
                    time.sleep(0.1)
            self.stop()  # the port was taken meanwhile, or it did not come up: another port
        raise RuntimeError("could not start moto.server on a free loopback port")

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after 10 s)."""
        stop_child(self.proc)

    def kill(self) -> None:
        """SIGKILL, as a store that goes away at once; reaped."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def client(self, service: str = "s3", key: str = TEST_KEY, secret: str = TEST_SECRET):
        import boto3
        return boto3.client(service, endpoint_url=self.url, aws_access_key_id=key, aws_secret_access_key=secret,
                            region_name=REGION)

    def options(self, key: str = TEST_KEY, secret: str = TEST_SECRET) -> dict:
        """storage_options for coordl / s3fs against this server."""
        return {"endpoint_url": self.url, "key": key, "secret": secret, "client_kwargs": {"region_name": REGION}}


def upload_folder(server: MotoServer, bucket: str, root: str, prefix: str = "") -> list[str]:
    """Create `bucket` (if needed) and put every file under `root` at prefix/<relative path>;
    returns the keys written (relative to prefix)."""
    s3 = server.client()
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    keys = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            with open(os.path.join(dirpath, name), "rb") as f:
                s3.put_object(Bucket=bucket, Key=f"{prefix.strip('/')}/{rel}" if prefix else rel, Body=f.read())
            keys.append(rel)
    return sorted(keys)


def enable_auth(server: MotoServer) -> tuple[str, str]:
    """Create an IAM user allowed s3:* and turn moto's authentication on (for the whole server:
    use a server of its own). Returns its (access key id, secret)."""
    iam = server.client("iam")
    iam.create_user(UserName="coordl")
    policy = iam.create_policy(PolicyName="s3all", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    iam.attach_user_policy(UserName="coordl", PolicyArn=policy["Policy"]["Arn"])
    created = iam.create_access_key(UserName="coordl")["AccessKey"]
    req = urllib.request.Request(f"{server.url}/moto-api/reset-auth", data=b"0", method="POST",
                                 headers={"Content-Type": "text/plain"})  # a form body would be parsed away
    with urllib.request.urlopen(req, timeout=10):
        pass
    return created["AccessKeyId"], created["SecretAccessKey"]
