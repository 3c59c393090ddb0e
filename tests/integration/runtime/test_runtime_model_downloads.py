"""Model URIs end to end: the pod's launcher fills an empty weights folder from real servers on 127.0.0.1.

Test design: one fixture per scheme starts a real server (a minimal hub speaking the Hugging Face Hub
routes snapshot_download uses, moto's S3 server, a Cloud Storage emulator, the
CNCF distribution registry over TLS with an htpasswd user, an HTTPS file server with its own CA and a
bearer token), publishes the tiny model there with that ecosystem's client, and returns the URI plus the
environment a pod would get from spec.model.credentialsSecret. The launcher (`launch.main --dry-run`)
then runs with exactly that environment; the weights folder must hold the same bytes as the source and
load as a tokenizer. Wrong or missing credentials must fail with spec.model.uri named.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from chatfleet_contract.tritonconfig import ChatModelConfig, config_file_name, model_repository_configs
from chatfleet_platform.common import procs
from chatfleet_platform.servers.objectstores import (
    GcsEmulator,
    HttpsFileServer,
    ModelHub,
    OciRegistry,
    S3Server,
)
from chatfleet_runtime.engine import loading
from chatfleet_runtime.launcher import launch
from chatfleet_runtime.sources import model_sources
from chatfleet_runtime.sources.model_sources import ModelSourceError

# Every variable a fetcher reads: cleared before each launch so only the published environment counts.
CREDENTIAL_VARS = (
    "HF_TOKEN",
    "HF_ENDPOINT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CA_BUNDLE",
    "GOOGLE_APPLICATION_CREDENTIALS_JSON",
    "STORAGE_EMULATOR_HOST",
    "ORAS_USER",
    "ORAS_PASS",
    "OCI_CA_BUNDLE",
    "CHATFLEET_MODEL_HTTP_TOKEN",
    "SSL_CERT_FILE",
)


@dataclass(frozen=True)
class Published:
    """A model published on a server: the URI, the pod environment that reads it, the revision."""

    uri: str
    env: dict[str, str]
    revision: str | None = None


def files_of(folder: Path) -> dict[str, bytes]:
    """{relative path: bytes} of the model files in a folder (.chatfleet-* markers, ours and the tiny
    model builder's, left out: a folder URL fetches the Hugging Face file set by name)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".chatfleet")
    }


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory, tiny_model_dir):
    """The tiny model as hub repository org/tiny (branch main) on a local hub that wants a token."""
    root = tmp_path_factory.mktemp("hub")
    shutil.copytree(tiny_model_dir, root / "org" / "tiny")
    with ModelHub(tmp_path_factory.mktemp("hub-server"), root=root, token="hf-token") as hub:
        yield Published("hf://org/tiny", {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf-token"}, revision="main")


@pytest.fixture(scope="module")
def s3_model(tmp_path_factory, tiny_model_dir):
    """The tiny model under s3://models/tiny/v1/ on moto's S3 server."""
    from minio import Minio

    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        client = Minio(
            f"127.0.0.1:{server.port}",
            access_key=server.access_key,
            secret_key=server.secret_key,
            secure=False,
            region="us-east-1",
        )
        client.make_bucket("models")
        for path in sorted(tiny_model_dir.rglob("*")):
            if path.is_file():
                client.fput_object("models", f"tiny/v1/{path.relative_to(tiny_model_dir)}", str(path))
        yield Published(
            "s3://models/tiny/v1",
            {
                "AWS_ENDPOINT_URL": server.url,
                "AWS_ACCESS_KEY_ID": server.access_key,
                "AWS_SECRET_ACCESS_KEY": server.secret_key,
                "AWS_REGION": "us-east-1",
            },
        )


@pytest.fixture(scope="module")
def gs_model(tmp_path_factory, tiny_model_dir):
    """The tiny model under gs://models/tiny/v1/ on the Cloud Storage emulator."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with GcsEmulator(tmp_path_factory.mktemp("gcs")) as server:
        client = storage.Client(
            project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": server.host}
        )
        bucket = client.create_bucket("models")
        for path in sorted(tiny_model_dir.rglob("*")):
            if path.is_file():
                bucket.blob(f"tiny/v1/{path.relative_to(tiny_model_dir)}").upload_from_filename(str(path))
        yield Published("gs://models/tiny/v1/", {"STORAGE_EMULATOR_HOST": server.host})


@pytest.fixture(scope="module")
def oci_model(tmp_path_factory, tiny_model_dir):
    """The tiny model as an ORAS artifact models/tiny:v1 (one layer per file) in a registry with a user."""
    import oras.client

    with OciRegistry(tmp_path_factory.mktemp("oci"), users={"fetcher": "fetcher-secret"}) as registry:
        client = oras.client.OrasClient(
            hostname=registry.host, tls_verify=str(registry.ca), auth_backend="basic"
        )
        client.auth.set_basic_auth("fetcher", "fetcher-secret")
        files = sorted(str(p.relative_to(tiny_model_dir)) for p in tiny_model_dir.iterdir() if p.is_file())
        cwd = os.getcwd()
        os.chdir(tiny_model_dir)  # oras names each layer by the path it was given
        try:
            assert client.push(target=f"{registry.host}/models/tiny:v1", files=files).status_code == 201
        finally:
            os.chdir(cwd)
        yield Published(
            f"oci://{registry.host}/models/tiny",
            {"ORAS_USER": "fetcher", "ORAS_PASS": "fetcher-secret", "OCI_CA_BUNDLE": str(registry.ca)},
            revision="v1",
        )


@pytest.fixture(scope="module")
def https_server(tmp_path_factory, tiny_model_dir):
    """An HTTPS server (own CA, bearer token) serving the model as a folder and as a .tar.gz archive."""
    root = tmp_path_factory.mktemp("www")
    shutil.copytree(tiny_model_dir, root / "tiny")
    with tarfile.open(root / "tiny.tar.gz", "w:gz") as tf:
        tf.add(tiny_model_dir, arcname="tiny")
    with HttpsFileServer(tmp_path_factory.mktemp("https"), root=root, token="fetch-token") as server:
        yield server


@pytest.fixture(scope="module")
def https_folder_model(https_server):
    """The model as a folder URL: the launcher fetches the Hugging Face file set by name."""
    env = {"SSL_CERT_FILE": str(https_server.ca), "CHATFLEET_MODEL_HTTP_TOKEN": "fetch-token"}
    return Published(f"{https_server.url}/tiny/", env)


@pytest.fixture(scope="module")
def https_archive_model(https_server):
    """The model as one .tar.gz archive holding a tiny/ folder."""
    env = {"SSL_CERT_FILE": str(https_server.ca), "CHATFLEET_MODEL_HTTP_TOKEN": "fetch-token"}
    return Published(f"{https_server.url}/tiny.tar.gz", env)


@pytest.fixture(scope="module")
def http_archive_model(tmp_path_factory, tiny_model_dir):
    """The model as a .zip archive on a plain-HTTP server (the CRD admits http:// too)."""
    root = tmp_path_factory.mktemp("www-plain")
    shutil.make_archive(str(root / "tiny"), "zip", root_dir=tiny_model_dir)
    with HttpsFileServer(tmp_path_factory.mktemp("http"), root=root, tls=False) as server:
        yield Published(f"{server.url}/tiny.zip", {})


SCHEMES = [
    "hf_model",
    "s3_model",
    "gs_model",
    "oci_model",
    "https_folder_model",
    "https_archive_model",
    "http_archive_model",
]


def pod_env(monkeypatch, published: Published) -> None:
    """Make os.environ look like the Triton container's: the URI, the revision and the Secret's keys."""
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CHATFLEET_MODEL_URI", published.uri)
    if published.revision:
        monkeypatch.setenv("CHATFLEET_MODEL_REVISION", published.revision)
    else:
        monkeypatch.delenv("CHATFLEET_MODEL_REVISION", raising=False)
    for name, value in published.env.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_launcher_fills_the_weights_folder(scheme, request, monkeypatch, tmp_path, tiny_model_dir, capsys):
    published: Published = request.getfixturevalue(scheme)
    pod_env(monkeypatch, published)
    weights, config_dir = tmp_path / "weights", tmp_path / "cm"
    config_dir.mkdir()
    for model, text in model_repository_configs(
        ChatModelConfig(model_dir=str(weights), kind="KIND_CPU")
    ).items():
        (config_dir / config_file_name(model)).write_text(text)

    rc = launch.main(
        [
            f"--config-dir={config_dir}",
            f"--repository={tmp_path / 'repo'}",
            f"--triton-home={tmp_path / 'h'}",
            "--dry-run",
        ]
    )

    assert rc == 0 and "tritonserver" in capsys.readouterr().out
    assert files_of(weights) == files_of(tiny_model_dir)
    assert not (weights / model_sources.STAGING).exists()
    assert loading.load_tokenizer(weights).chat_template


@pytest.mark.parametrize(
    ("scheme", "drop", "change", "message"),
    [
        pytest.param("hf_model", ("HF_TOKEN",), {}, r"the hub said", id="hf-no-token"),
        pytest.param("hf_model", (), {"HF_TOKEN": "wrong"}, r"the hub said", id="hf-wrong-token"),
        pytest.param(
            "s3_model",
            (),
            {"AWS_ACCESS_KEY_ID": "AKIANOTAUSER"},
            r"S3 said InvalidAccessKeyId",
            id="s3-wrong-key",
        ),
        pytest.param(
            "s3_model",
            (),
            {"AWS_SECRET_ACCESS_KEY": "wrong"},
            r"S3 said SignatureDoesNotMatch",
            id="s3-wrong-secret",
        ),
        pytest.param(
            "s3_model",
            ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
            {},
            r"(S3 said AccessDenied|the S3 request failed: .*Response code: 500)",  # moto answers 500
            id="s3-anonymous",
        ),
        pytest.param(
            "oci_model", (), {"ORAS_PASS": "wrong"}, r"pull failed: .*Unauthorized", id="oci-wrong-password"
        ),
        pytest.param(
            "oci_model",
            ("ORAS_USER", "ORAS_PASS"),
            {},
            r"the registry asks for a user and password; put ORAS_USER and ORAS_PASS in spec\.model\.credentialsSecret",
            id="oci-no-credentials",
        ),
        pytest.param(
            "oci_model", ("OCI_CA_BUNDLE",), {}, r"CERTIFICATE_VERIFY_FAILED", id="oci-untrusted-ca"
        ),
        pytest.param(
            "https_folder_model",
            ("CHATFLEET_MODEL_HTTP_TOKEN",),
            {},
            r"config\.json answered 401",
            id="https-no-token",
        ),
        pytest.param(
            "https_archive_model",
            (),
            {"CHATFLEET_MODEL_HTTP_TOKEN": "x"},
            r"answered 401",
            id="https-wrong-token",
        ),
        pytest.param(
            "https_folder_model",
            ("SSL_CERT_FILE",),
            {},
            r"CERTIFICATE_VERIFY_FAILED",
            id="https-untrusted-ca",
        ),
    ],
)
def test_wrong_credentials_fail_naming_the_field(scheme, drop, change, message, request, tmp_path):
    published: Published = request.getfixturevalue(scheme)
    env = {k: v for k, v in published.env.items() if k not in drop} | change
    with pytest.raises(ModelSourceError, match=r"^spec\.model\.uri .*" + message):
        model_sources.fetch(published.uri, tmp_path / "weights", revision=published.revision, env=env)
    assert not (tmp_path / "weights" / "config.json").exists()


@pytest.mark.parametrize(
    ("scheme", "uri", "message"),
    [
        pytest.param(
            "hf_model", "hf://org/no-such-model", r"the hub said RepositoryNotFoundError", id="hf-no-repo"
        ),
        pytest.param(
            "s3_model", "s3://models/no-such-model", r"nothing was found there", id="s3-empty-prefix"
        ),
        pytest.param("s3_model", "s3://no-such-bucket/tiny", r"S3 said NoSuchBucket", id="s3-no-bucket"),
        pytest.param(
            "gs_model", "gs://models/no-such-model", r"nothing was found there", id="gs-empty-prefix"
        ),
        pytest.param("gs_model", "gs://no-such-bucket/tiny", r"Cloud Storage said", id="gs-no-bucket"),
    ],
)
def test_missing_objects_fail_naming_the_field(scheme, uri, message, request, tmp_path):
    published: Published = request.getfixturevalue(scheme)
    with pytest.raises(ModelSourceError, match=r"^spec\.model\.uri .*" + message):
        model_sources.fetch(uri, tmp_path / "weights", env=published.env)


@pytest.mark.parametrize(
    ("uri", "env", "message"),
    [
        pytest.param(
            "s3://models/tiny",
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:{port}"},
            "the S3 request failed",
            id="s3",
        ),
        pytest.param("oci://127.0.0.1:{port}/models/tiny:v1", {}, "registry not reachable", id="oci"),
        pytest.param("https://127.0.0.1:{port}/tiny/", {}, "config.json failed", id="https"),
    ],
)
def test_unreachable_servers_fail_naming_the_field(uri, env, message, tmp_path):
    port = procs.free_port()  # nothing listens there
    env = {k: v.format(port=port) for k, v in env.items()}
    with pytest.raises(ModelSourceError, match=r"^spec\.model\.uri .*" + message):
        model_sources.fetch(uri.format(port=port), tmp_path / "weights", env=env)


def test_a_tokenizer_uri_is_fetched_once_into_the_cache(s3_model, monkeypatch, tmp_path, tiny_model_dir):
    """spec.model.tokenizer may be any admitted URI: the loader fetches it once into the cache, then reuses it."""
    pod_env(monkeypatch, s3_model)
    monkeypatch.setenv("CHATFLEET_MODEL_CACHE", str(tmp_path / "cache"))
    assert loading.load_tokenizer(s3_model.uri).chat_template
    (cached,) = (tmp_path / "cache").iterdir()
    assert files_of(cached) == files_of(tiny_model_dir)
    (cached / "config.json").write_text("{}")  # a second resolve must not download again
    assert loading.resolve_model_path(s3_model.uri) == cached
    assert (cached / "config.json").read_text() == "{}"
