"""One fetcher per model-URI scheme: each downloads into a folder with the credentials in `env`.

The table of schemes, libraries and environment variables is in ``chatfleet_runtime.sources.model_sources``,
which picks the fetcher (``FETCHERS``) and makes the download atomic.
"""

from __future__ import annotations

import json
import logging
import shutil
import ssl
import tarfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlparse

from chatfleet_runtime.sources.model_uri import FIELD, ModelSourceError, ModelUri, safe_join

log = logging.getLogger(__name__)

# A folder over plain HTTP(S) is fetched as the usual Hugging Face file set: these are tried, a 404 skips.
HTTP_OPTIONAL_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


Fetcher = Callable[[ModelUri, Path, Mapping[str, str], str | None], None]


# --- file:// and plain paths ------------------------------------------------------------------------


def fetch_file(source: ModelUri, dest: Path, env: Mapping[str, str], revision: str | None) -> None:
    """Copy a local folder (file:// or a path) into dest."""
    path = Path(source.path)
    if not path.is_dir():
        raise ModelSourceError(f"{FIELD} {source.raw!r}: {str(path)!r} is not a folder")
    shutil.copytree(path, dest, dirs_exist_ok=True)


# --- hf:// -------------------------------------------------------------------------------------------


def fetch_hf(source: ModelUri, dest: Path, env: Mapping[str, str], revision: str | None) -> None:
    """Download a Hugging Face hub snapshot (ORG/MODEL at revision) with huggingface_hub; HF_TOKEN
    authenticates, HF_ENDPOINT names a mirror."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    repo_id = f"{source.host}/{source.key_prefix}"
    try:
        snapshot_download(
            repo_id,
            revision=revision,
            local_dir=str(dest),
            token=env.get("HF_TOKEN") or None,
            endpoint=env.get("HF_ENDPOINT") or None,
        )
    except (HfHubHTTPError, EntryNotFoundError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelSourceError(f"{FIELD} {source.raw!r}: the hub said {type(e).__name__}: {first}") from e
    shutil.rmtree(dest / ".cache", ignore_errors=True)  # huggingface_hub's download bookkeeping


# --- s3:// -------------------------------------------------------------------------------------------


def s3_client(env: Mapping[str, str]):
    """A minio S3 client from the AWS_* variables (endpoint default: AWS's own; anonymous without keys)."""
    import urllib3
    from minio import Minio

    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "https://s3.amazonaws.com"
    parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ModelSourceError(f"AWS_ENDPOINT_URL {endpoint!r}: must be http(s)://HOST[:PORT]")
    ca = env.get("AWS_CA_BUNDLE")
    http = urllib3.PoolManager(
        cert_reqs="CERT_REQUIRED", ca_certs=ca, retries=urllib3.Retry(total=3, backoff_factor=0.5)
    )
    return Minio(
        parsed.netloc,
        access_key=env.get("AWS_ACCESS_KEY_ID") or None,
        secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        session_token=env.get("AWS_SESSION_TOKEN") or None,
        secure=parsed.scheme == "https",
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        http_client=http,
    )


def fetch_s3(source: ModelUri, dest: Path, env: Mapping[str, str], revision: str | None) -> None:
    """Download every object under s3://BUCKET/PREFIX/ (keys keep their path below the prefix)."""
    import urllib3
    from minio.error import MinioException, S3Error

    client = s3_client(env)
    prefix = f"{source.key_prefix}/" if source.key_prefix else ""
    try:
        for obj in client.list_objects(source.host, prefix=prefix, recursive=True):
            if obj.is_dir or obj.object_name.endswith("/"):
                continue
            target = safe_join(dest, obj.object_name[len(prefix) :], source.raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            client.fget_object(source.host, obj.object_name, str(target))
    except S3Error as e:
        raise ModelSourceError(f"{FIELD} {source.raw!r}: S3 said {e.code}: {e.message}") from e
    except (MinioException, urllib3.exceptions.HTTPError) as e:
        raise ModelSourceError(f"{FIELD} {source.raw!r}: the S3 request failed: {e}") from e


# --- gs:// -------------------------------------------------------------------------------------------


def gcs_client(env: Mapping[str, str]):
    """A google-cloud-storage client: a service-account key from GOOGLE_APPLICATION_CREDENTIALS_JSON,
    else Application Default Credentials; STORAGE_EMULATOR_HOST points it at an emulator."""
    from google.cloud import storage

    emulator = env.get("STORAGE_EMULATOR_HOST")
    options = {"api_endpoint": emulator} if emulator else None
    key = env.get("GOOGLE_APPLICATION_CREDENTIALS_JSON")
    if key:
        from google.oauth2 import service_account

        try:
            info = json.loads(key)
            credentials = service_account.Credentials.from_service_account_info(
                info, scopes=["https://www.googleapis.com/auth/devstorage.read_only"]
            )
        except (ValueError, KeyError) as e:
            raise ModelSourceError(
                f"GOOGLE_APPLICATION_CREDENTIALS_JSON: not a service-account key ({e})"
            ) from e
        return storage.Client(
            project=info.get("project_id"),
            credentials=credentials,
            client_options=options,
            use_auth_w_custom_endpoint=not emulator,
        )
    if emulator:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=env.get("GOOGLE_CLOUD_PROJECT") or "chatfleet",
            credentials=AnonymousCredentials(),
            client_options=options,
        )
    return storage.Client(project=env.get("GOOGLE_CLOUD_PROJECT") or None)


def fetch_gs(source: ModelUri, dest: Path, env: Mapping[str, str], revision: str | None) -> None:
    """Download every object under gs://BUCKET/PREFIX/ (names keep their path below the prefix)."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    prefix = f"{source.key_prefix}/" if source.key_prefix else ""
    try:
        client = gcs_client(env)
        for blob in client.list_blobs(source.host, prefix=prefix):
            if blob.name.endswith("/"):
                continue
            target = safe_join(dest, blob.name[len(prefix) :], source.raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(target))
    except gexc.GoogleAPIError as e:
        raise ModelSourceError(f"{FIELD} {source.raw!r}: Cloud Storage said {e}") from e
    except auth_exc.GoogleAuthError as e:
        raise ModelSourceError(
            f"{FIELD} {source.raw!r}: no Google credentials ({e}); put GOOGLE_APPLICATION_CREDENTIALS_JSON "
            "in spec.model.credentialsSecret or give the pod a workload identity"
        ) from e


# --- oci:// ------------------------------------------------------------------------------------------


def oci_reference(source: ModelUri, revision: str | None) -> str:
    """REGISTRY/REPOSITORY:TAG (or @DIGEST) for oras; without a tag or digest, `revision` is the tag.

    >>> oci_reference(parse_uri("oci://r.example:5000/models/tiny"), "v1")
    'r.example:5000/models/tiny:v1'
    >>> oci_reference(parse_uri("oci://r.example/models/tiny:v2"), "main")
    'r.example/models/tiny:v2'
    """
    repo = source.key_prefix
    last = repo.rsplit("/", 1)[-1]
    if "@" in last or ":" in last:
        return f"{source.host}/{repo}"
    return f"{source.host}/{repo}:{revision or 'latest'}"


def fetch_oci(source: ModelUri, dest: Path, env: Mapping[str, str], revision: str | None) -> None:
    """Pull an OCI artifact (ORAS layout: one layer per file, named by its title annotation) with oras."""
    import oras.client
    import requests

    verify: bool | str = env.get("OCI_CA_BUNDLE") or True
    user, password = env.get("ORAS_USER"), env.get("ORAS_PASS")
    # Registries answer /v2/ with the scheme they want: Basic (htpasswd) or Bearer (a token service).
    try:
        probe = requests.get(f"https://{source.host}/v2/", verify=verify, timeout=30)
    except requests.RequestException as e:
        raise ModelSourceError(f"{FIELD} {source.raw!r}: registry not reachable: {e}") from e
    backend = "basic" if probe.headers.get("Www-Authenticate", "").lower().startswith("basic") else "token"
    if backend == "basic" and not (user and password):
        raise ModelSourceError(
            f"{FIELD} {source.raw!r}: the registry asks for a user and password; put ORAS_USER and "
            "ORAS_PASS in spec.model.credentialsSecret"
        )
    client = oras.client.OrasClient(hostname=source.host, tls_verify=verify, auth_backend=backend)
    if user and password:
        client.auth.set_basic_auth(user, password)
    try:
        files = client.pull(target=oci_reference(source, revision), outdir=str(dest))
    except (ValueError, requests.RequestException) as e:
        raise ModelSourceError(f"{FIELD} {source.raw!r}: pull failed: {e}") from e
    if not files:
        raise ModelSourceError(f"{FIELD} {source.raw!r}: the artifact has no layers")


# --- http:// and https:// -----------------------------------------------------------------------------


def _http_client(env: Mapping[str, str]):
    """An httpx client: SSL_CERT_FILE as the trusted CAs if set, a Bearer token if set, redirects followed."""
    import httpx

    ca = env.get("SSL_CERT_FILE")
    verify: bool | ssl.SSLContext = ssl.create_default_context(cafile=ca) if ca else True
    headers = {}
    if env.get("CHATFLEET_MODEL_HTTP_TOKEN"):
        headers["Authorization"] = f"Bearer {env['CHATFLEET_MODEL_HTTP_TOKEN']}"
    return httpx.Client(
        verify=verify,
        headers=headers,
        follow_redirects=True,
        timeout=httpx.Timeout(60.0, connect=15.0),
        trust_env=False,
    )


def _download(client, url: str, target: Path, uri: str, *, optional: bool = False) -> bool:
    """Stream url into target; False for a 404 of an optional file, ModelSourceError for other failures."""
    import httpx

    try:
        with client.stream("GET", url) as response:
            if response.status_code == 404 and optional:
                return False
            if response.status_code != 200:
                raise ModelSourceError(f"{FIELD} {uri!r}: GET {url} answered {response.status_code}")
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as out:
                for chunk in response.iter_bytes(1 << 20):
                    out.write(chunk)
    except httpx.HTTPError as e:
        raise ModelSourceError(f"{FIELD} {uri!r}: GET {url} failed: {e}") from e
    return True


def _extract(archive: Path, dest: Path, uri: str) -> None:
    """Unpack a .tar(.gz)/.tgz or .zip into dest, refusing members that would land outside it."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                safe_join(dest, name, uri)
            zf.extractall(dest)
        return
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    except tarfile.FilterError as e:
        raise ModelSourceError(f"{FIELD} {uri!r}: refusing the unsafe archive member ({e})") from e
    except tarfile.TarError as e:
        raise ModelSourceError(f"{FIELD} {uri!r}: not a readable tar or zip archive ({e})") from e


def fetch_http(source: ModelUri, dest: Path, env: Mapping[str, str], revision: str | None) -> None:
    """Download an archive and unpack it, or a folder URL (ending in /) as the Hugging Face file set:
    config.json, the safetensors weights (sharded via model.safetensors.index.json or one file) and the
    tokenizer files that exist."""
    url = source.raw
    with _http_client(env) as client:
        if not urlparse(url).path.endswith("/"):
            archive = dest / ".archive"
            _download(client, url, archive, url)
            _extract(archive, dest, url)
            archive.unlink()
            return
        _download(client, url + "config.json", dest / "config.json", url)
        index = dest / "model.safetensors.index.json"
        if _download(client, url + index.name, index, url, optional=True):
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, AttributeError) as e:
                raise ModelSourceError(f"{FIELD} {url!r}: {index.name} has no weight_map ({e})") from e
            for shard in shards:
                _download(client, url + shard, safe_join(dest, shard, url), url)
        else:
            _download(client, url + "model.safetensors", dest / "model.safetensors", url)
        for name in HTTP_OPTIONAL_FILES:
            _download(client, url + name, dest / name, url, optional=True)


FETCHERS: dict[str, Fetcher] = {
    "file": fetch_file,
    "hf": fetch_hf,
    "s3": fetch_s3,
    "gs": fetch_gs,
    "oci": fetch_oci,
    "http": fetch_http,
    "https": fetch_http,
}
