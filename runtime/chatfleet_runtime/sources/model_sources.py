"""Fetch model weights named by `spec.model.uri` into the pod's weights folder, one fetcher per scheme.

Every scheme the CRD admits (`hf|s3|gs|oci|http|https`, plus `file://` and plain paths for local runs) has
one entry in `FETCHERS` (``chatfleet_runtime.sources.fetchers``); `fetch(uri, dest)` parses the URI
(``chatfleet_runtime.sources.model_uri``) and picks it. Credentials come from the environment, which in a
pod is the Triton container's: the keys of `spec.model.credentialsSecret` become environment variables
(docs/api.md, "Model URIs"):

| scheme | library | credentials and settings read from the environment |
| --- | --- | --- |
| hf:// | huggingface_hub | HF_TOKEN, HF_ENDPOINT |
| s3:// | minio (S3 API) | AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_CA_BUNDLE |
| gs:// | google-cloud-storage | GOOGLE_APPLICATION_CREDENTIALS_JSON (a service-account key), else Application Default Credentials; STORAGE_EMULATOR_HOST |
| oci:// | oras | ORAS_USER, ORAS_PASS; OCI_CA_BUNDLE |
| http(s):// | httpx | CHATFLEET_MODEL_HTTP_TOKEN (sent as a Bearer token); SSL_CERT_FILE |

A fetch writes into a staging folder inside `dest` and moves the files up at the end, `config.json`
last, so a folder holding `config.json` is always a complete download (the launcher keeps such a folder).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from chatfleet_runtime.sources.fetchers import FETCHERS
from chatfleet_runtime.sources.model_uri import FIELD, ModelSourceError, parse_uri

__all__ = ["FETCHERS", "MARKER", "STAGING", "ModelSourceError", "fetch", "parse_uri"]

log = logging.getLogger(__name__)

STAGING = ".chatfleet-partial"
MARKER = ".chatfleet-source"  # written last: the URI a complete download came from


def fetch(uri: str, dest: Path, *, revision: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Download the model at `uri` into `dest` (created), using credentials from `env` (default os.environ)."""
    source = parse_uri(uri)
    env = os.environ if env is None else env
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    staging = dest / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        FETCHERS[source.scheme](source, staging, env, revision)
        root = _content_root(staging)
        if not any(root.iterdir()):
            raise ModelSourceError(f"{FIELD} {uri!r}: nothing was found there")
        _promote(root, dest)
        (dest / MARKER).write_text(uri)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("Fetched model weights from %s into %s", uri, dest)
    return dest


def _content_root(staging: Path) -> Path:
    """The folder holding the files: the staging folder, or its only subfolder when that is all it holds."""
    entries = list(staging.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not (staging / "config.json").exists():
        return entries[0]
    return staging


def _promote(root: Path, dest: Path) -> None:
    """Move every entry of root into dest, config.json last (its presence marks a complete download)."""
    entries = sorted(root.iterdir(), key=lambda p: p.name == "config.json")
    for entry in entries:
        target = dest / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        shutil.move(str(entry), str(target))
