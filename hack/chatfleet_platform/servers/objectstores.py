"""Real servers for the model-URI fetchers, started on 127.0.0.1 free ports with their own folders.

- `S3Server`: moto's S3-compatible server with one IAM user (its own venv, hack/build-test-servers.sh).
- `GcsEmulator`: gcp-storage-emulator, a Cloud Storage JSON-API server (the dev group).
- `OciRegistry`: the CNCF distribution registry over TLS with htpasswd users (built by the same script).
- `ModelHub`: the few Hugging Face Hub routes snapshot_download uses (chatfleet_platform.servers.hubserver).
- `HttpsFileServer`: a static HTTPS (or plain HTTP) file server (chatfleet_platform.servers.fileserver),
  optional bearer token.

Each is a context manager and stops exactly the process it started. A missing server binary is built on
first use, like the platform's binaries; a build that fails is an error with the command to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chatfleet_platform.common import pki, procs
from chatfleet_platform.common.config import REPO_ROOT, PlatformError, cache_dir, read_versions

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-test-servers.sh"


def registry_binary() -> Path:
    """Where the pinned distribution registry lives (built or not)."""
    v = read_versions()["DISTRIBUTION_VERSION"]
    return cache_dir() / "bin" / f"registry-{v}" / "registry"


def moto_server_binary() -> Path:
    """Where moto_server lives in its own venv (installed or not)."""
    v = read_versions()["MOTO_VERSION"]
    return cache_dir() / "tools" / f"moto-{v}" / "bin" / "moto_server"


def _ensure(path: Path, target: str) -> Path:
    """The executable at path, building it with hack/build-test-servers.sh TARGET when missing."""
    ready = path.exists() and (target != "moto" or (path.parents[1] / ".complete").exists())
    if not ready:
        result = subprocess.run(["bash", str(BUILD_SCRIPT), target], capture_output=True, text=True)
        if result.returncode != 0 or not path.exists():
            raise PlatformError(
                f"{target}: `bash {BUILD_SCRIPT} {target}` failed; run it to see why:\n{result.stderr[-2000:]}"
            )
    return path


@dataclass
class _Server:
    workdir: Path
    port: int = 0
    proc: procs.Proc | None = None

    def _start(self, name: str, argv: list[str], check, timeout: float, env: dict | None = None) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"{name}.log"
        self.proc = procs.start(name, argv, log=log, env=env)
        procs.wait_for(name, check, timeout=timeout, log=log, proc=self.proc)

    def stop(self) -> None:
        """Stop the server we started."""
        procs.stop(self.proc)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self):  # pragma: no cover - overridden
        raise NotImplementedError


# Run by moto's own venv (it has boto3): one IAM user allowed s3:*, its access key printed as JSON.
_MOTO_IAM_USER = """
import json, sys, boto3
iam = boto3.client("iam", endpoint_url=sys.argv[1], region_name="us-east-1",
                   aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
iam.create_user(UserName="fetcher")
iam.put_user_policy(UserName="fetcher", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="fetcher")["AccessKey"]
print(json.dumps([key["AccessKeyId"], key["SecretAccessKey"]]))
"""


@dataclass
class S3Server(_Server):
    """moto_server: an S3 API on http://127.0.0.1:PORT that checks signatures against one IAM user.

    moto lets the first INITIAL_NO_AUTH_ACTION_COUNT requests through unsigned: exactly the three IAM
    calls that create the user; from then on a wrong key or secret is refused like AWS does.
    """

    access_key: str = ""
    secret_key: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> S3Server:
        """Start, wait until the port answers, and create the IAM user (access_key, secret_key)."""
        binary = _ensure(moto_server_binary(), "moto")
        self.port = self.port or procs.free_port()
        self._start(
            "moto",
            [str(binary), "-H", "127.0.0.1", "-p", str(self.port)],
            lambda: procs.port_in_use(self.port),
            timeout,
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"},
        )
        result = subprocess.run(
            [str(binary.parent / "python"), "-c", _MOTO_IAM_USER, self.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            self.stop()
            raise PlatformError(f"moto: could not create the IAM user:\n{result.stderr[-2000:]}")
        self.access_key, self.secret_key = json.loads(result.stdout)
        return self


@dataclass
class GcsEmulator(_Server):
    """gcp-storage-emulator: the Cloud Storage JSON API on http://127.0.0.1:PORT, in memory."""

    @property
    def host(self) -> str:
        """The value for STORAGE_EMULATOR_HOST."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> GcsEmulator:
        """Start and wait until the port answers."""
        self.port = self.port or procs.free_port()
        self._start(
            "gcs-emulator",
            [
                sys.executable,
                "-m",
                "gcp_storage_emulator",
                "start",
                "--host=127.0.0.1",
                f"--port={self.port}",
                "--in-memory",
            ],
            lambda: procs.port_in_use(self.port),
            timeout,
        )
        return self


@dataclass
class OciRegistry(_Server):
    """The distribution registry on https://127.0.0.1:PORT with its own CA and htpasswd `users`."""

    users: dict[str, str] = field(default_factory=dict)
    ca: Path | None = None

    @property
    def host(self) -> str:
        """REGISTRY host:port as written in oci:// references."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> OciRegistry:
        """Write the TLS pair, htpasswd file and config, start, and wait until the port answers."""
        import bcrypt

        binary = _ensure(registry_binary(), "registry")
        self.workdir = Path(self.workdir).resolve()
        self.ca, crt, key = pki.serving_pair(self.workdir / "pki", "registry")
        self.port = self.port or procs.free_port()
        config: dict = {
            "version": 0.1,
            "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": str(self.workdir / "data")}},
            "http": {
                "addr": f"127.0.0.1:{self.port}",
                "tls": {"certificate": str(crt), "key": str(key)},
                "debug": {"addr": ""},
            },
        }
        if self.users:
            htpasswd = self.workdir / "htpasswd"
            htpasswd.write_text(
                "".join(
                    f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=5)).decode()}\n"
                    for u, p in self.users.items()
                )
            )
            config["auth"] = {"htpasswd": {"realm": "chatfleet-test", "path": str(htpasswd)}}
        cfg = self.workdir / "config.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": "true"}
        self._start(
            "registry", [str(binary), "serve", str(cfg)], lambda: procs.port_in_use(self.port), timeout, env
        )
        return self


@dataclass
class HttpsFileServer(_Server):
    """A static server of `root` on https://127.0.0.1:PORT with its own CA (plain http with tls=False);
    optional bearer token."""

    root: Path = Path()
    token: str | None = None
    tls: bool = True
    ca: Path | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> HttpsFileServer:
        """Write the TLS pair (tls=True), start, and wait until the port answers."""
        self.workdir = Path(self.workdir).resolve()
        self.port = self.port or procs.free_port()
        argv = [
            sys.executable,
            "-m",
            "chatfleet_platform.servers.fileserver",
            f"--root={Path(self.root).resolve()}",
            f"--port={self.port}",
        ]
        if self.tls:
            self.ca, crt, key = pki.serving_pair(self.workdir / "pki", "files")
            argv += [f"--cert={crt}", f"--key={key}"]
        if self.token:
            argv.append(f"--token={self.token}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self._start("https-files", argv, lambda: procs.port_in_use(self.port), timeout, env)
        return self


@dataclass
class ModelHub(_Server):
    """A minimal model hub on http://127.0.0.1:PORT serving root/ORG/NAME as ORG/NAME; optional token."""

    root: Path = Path()
    token: str | None = None

    @property
    def url(self) -> str:
        """The value for HF_ENDPOINT."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> ModelHub:
        """Start and wait until the port answers."""
        self.port = self.port or procs.free_port()
        argv = [
            sys.executable,
            "-m",
            "chatfleet_platform.servers.hubserver",
            f"--root={Path(self.root).resolve()}",
            f"--port={self.port}",
        ]
        if self.token:
            argv.append(f"--token={self.token}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self._start("hub", argv, lambda: procs.port_in_use(self.port), timeout, env)
        return self
