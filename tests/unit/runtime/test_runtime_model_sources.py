"""Model URIs: parsing, the scheme registry against the CRD, archive safety, credential parsing.

The fetchers themselves run against real servers in tests/integration/runtime/test_runtime_model_downloads.py.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from chatfleet_contract.tritonconfig import model_repository_configs, parse_parameters
from chatfleet_runtime.engine.service import ServiceSettings
from chatfleet_runtime.sources import fetchers, model_sources
from chatfleet_runtime.sources.fetchers import oci_reference
from chatfleet_runtime.sources.model_uri import SCHEMES, ModelSourceError, ModelUri, parse_uri

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "crds" / "chatfleet.io_chatbotservices.yaml"


def crd_uri_schemes() -> set[str]:
    """The schemes spec.model.uri's pattern admits, e.g. '^(hf|s3|gs|oci|https?)://...' -> {hf, ..., http, https}."""
    doc = yaml.safe_load(CRD.read_text())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pattern = spec["properties"]["model"]["properties"]["uri"]["pattern"]
    alternatives = re.match(r"\^\(([^)]*)\)://", pattern).group(1).split("|")
    schemes: set[str] = set()
    for alt in alternatives:
        schemes |= {alt[:-2], alt[:-1]} if alt.endswith("s?") else {alt}
    return schemes


def test_every_scheme_the_crd_admits_has_a_fetcher():
    schemes = crd_uri_schemes()
    assert schemes >= {"hf", "s3", "https"}, schemes
    assert schemes <= set(model_sources.FETCHERS), schemes - set(model_sources.FETCHERS)
    assert set(model_sources.FETCHERS) == set(SCHEMES)  # what parse_uri admits can be fetched


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        pytest.param("hf://org/model", ModelUri("hf", "org", "/model", "hf://org/model"), id="hf"),
        pytest.param("huggingface://org/m", ModelUri("hf", "org", "/m", "huggingface://org/m"), id="hf-long"),
        pytest.param("org/model", ModelUri("hf", "org", "/model", "org/model"), id="bare-hub-id"),
        pytest.param("s3://bucket/a/b/", ModelUri("s3", "bucket", "/a/b/", "s3://bucket/a/b/"), id="s3"),
        pytest.param("s3://bucket", ModelUri("s3", "bucket", "", "s3://bucket"), id="s3-bucket-root"),
        pytest.param("gs://b/m", ModelUri("gs", "b", "/m", "gs://b/m"), id="gs"),
        pytest.param(
            "oci://r:5000/m/t:v1", ModelUri("oci", "r:5000", "/m/t:v1", "oci://r:5000/m/t:v1"), id="oci"
        ),
        pytest.param("https://h/m/", ModelUri("https", "h", "/m/", "https://h/m/"), id="https-folder"),
        pytest.param(
            "http://h/m.tar.gz", ModelUri("http", "h", "/m.tar.gz", "http://h/m.tar.gz"), id="http-archive"
        ),
        pytest.param(
            "https://h/m.zip?sig=1",
            ModelUri("https", "h", "/m.zip?sig=1", "https://h/m.zip?sig=1"),
            id="query",
        ),
        pytest.param("file:///w", ModelUri("file", "", "/w", "file:///w"), id="file"),
        pytest.param(
            "/models/weights", ModelUri("file", "", "/models/weights", "/models/weights"), id="path"
        ),
    ],
)
def test_parse_uri(uri, expected):
    assert parse_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        pytest.param(
            "ftp://h/m", r"scheme 'ftp' is not one of file, gs, hf, http, https, oci, s3", id="scheme"
        ),
        pytest.param("s3:///prefix", r"the bucket is missing after s3://", id="s3-no-bucket"),
        pytest.param("gs:///prefix", r"the bucket is missing after gs://", id="gs-no-bucket"),
        pytest.param("oci://registry", r"write oci://REGISTRY/REPOSITORY", id="oci-no-repo"),
        pytest.param("hf://org", r"write hf://ORG/MODEL", id="hf-no-model"),
        pytest.param("https://h/model.bin", r"names a folder \(ending in /\) or an archive", id="https-file"),
        pytest.param("s3://b/a b", r"without spaces", id="space"),
        pytest.param("", r"non-empty", id="empty"),
    ],
)
def test_parse_uri_refuses_with_the_field_named(uri, message):
    with pytest.raises(ModelSourceError, match=r"^spec\.model\.uri .*" + message):
        parse_uri(uri)


@pytest.mark.parametrize(
    ("uri", "revision", "expected"),
    [
        pytest.param("oci://r:5000/models/tiny", "v1", "r:5000/models/tiny:v1", id="revision-is-the-tag"),
        pytest.param("oci://r/models/tiny:v2", "main", "r/models/tiny:v2", id="tag-in-uri-wins"),
        pytest.param("oci://r/m@sha256:" + "a" * 64, "main", "r/m@sha256:" + "a" * 64, id="digest"),
        pytest.param("oci://r/m", None, "r/m:latest", id="no-revision"),
    ],
)
def test_oci_reference(uri, revision, expected):
    assert oci_reference(parse_uri(uri), revision) == expected


def test_fetch_of_a_local_folder_marks_completion_and_leaves_no_staging(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"w")
    dest = model_sources.fetch(f"file://{src}", tmp_path / "dest")
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == [
        model_sources.MARKER,
        "config.json",
        "sub",
        "sub/w.bin",
    ]
    assert (dest / model_sources.MARKER).read_text() == f"file://{src}"


def test_fetch_of_nothing_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match=r"spec\.model\.uri .*nothing was found there"):
        model_sources.fetch(str(tmp_path / "empty"), tmp_path / "dest")
    assert not (tmp_path / "dest" / "config.json").exists()


def _tar_with(name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo(name)
        info.size = 2
        tf.addfile(info, io.BytesIO(b"{}"))
    return buf.getvalue()


def test_archives_cannot_write_outside_the_weights_folder(tmp_path):
    tar = tmp_path / "evil.tar.gz"
    tar.write_bytes(_tar_with("../escaped.json"))
    with pytest.raises(ModelSourceError, match=r"refusing the unsafe archive member .*escaped\.json"):
        fetchers._extract(tar, tmp_path / "out", "https://h/evil.tar.gz")
    zpath = tmp_path / "evil.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("../escaped.json", "{}")
    with pytest.raises(ModelSourceError, match=r"refusing the unsafe file name '\.\./escaped\.json'"):
        fetchers._extract(zpath, tmp_path / "out", "https://h/evil.zip")
    assert not (tmp_path / "escaped.json").exists()


def test_gcs_service_account_key_must_parse():
    with pytest.raises(
        ModelSourceError, match=r"GOOGLE_APPLICATION_CREDENTIALS_JSON: not a service-account key"
    ):
        fetchers.gcs_client({"GOOGLE_APPLICATION_CREDENTIALS_JSON": json.dumps({"type": "x"})})


def test_gcs_service_account_key_is_used(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "proj-1",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "fetcher@proj-1.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    client = fetchers.gcs_client({"GOOGLE_APPLICATION_CREDENTIALS_JSON": json.dumps(info)})
    assert client.project == "proj-1"
    assert client._credentials.service_account_email == "fetcher@proj-1.iam.gserviceaccount.com"


def test_s3_endpoint_must_be_http():
    with pytest.raises(
        ModelSourceError, match=r"AWS_ENDPOINT_URL 'ftp://x': must be http\(s\)://HOST\[:PORT\]"
    ):
        fetchers.s3_client({"AWS_ENDPOINT_URL": "ftp://x"})


def test_tokenizer_uri_wins_over_the_weights_folder():
    """spec.model.tokenizer as a URI reaches the loader (it used to be shadowed by tokenizer_dir)."""
    from chatfleet_operator.builders.tritonconfig import chat_model_config
    from chatfleet_operator.spec import ChatbotServiceSpec

    spec = ChatbotServiceSpec.from_dict({"model": {"uri": "s3://b/m", "tokenizer": "s3://b/tok"}})
    params = parse_parameters(model_repository_configs(chat_model_config(spec))["chat"])
    assert ServiceSettings.from_parameters(params).tokenizer_source == "s3://b/tok"
