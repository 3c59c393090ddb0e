"""A model URI (`spec.model.uri`, `spec.model.tokenizer`) parsed and checked, before anything is fetched.

The messages name the field and say what to write, e.g. ``spec.model.uri 'hf://': the organisation is
missing after hf://``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

FIELD = "spec.model.uri"
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
#: The schemes there is a fetcher for (chatfleet_runtime.sources.fetchers.FETCHERS has exactly these keys).
SCHEMES = ("file", "hf", "s3", "gs", "oci", "http", "https")


class ModelSourceError(ValueError):
    """A model URI that cannot be used; the message names spec.model.uri and says why."""


@dataclass(frozen=True)
class ModelUri:
    """A parsed model URI: scheme, host (bucket, registry or hub org) and path, as written."""

    scheme: str
    host: str
    path: str
    raw: str

    @property
    def key_prefix(self) -> str:
        """The object-key prefix below the bucket, without slashes at either end ('' for the bucket root)."""
        return self.path.strip("/")


def parse_uri(uri: str) -> ModelUri:
    """Parse a model URI, refusing unknown schemes and missing parts with a message naming the field.

    >>> parse_uri("s3://models/llama/v1")
    ModelUri(scheme='s3', host='models', path='/llama/v1', raw='s3://models/llama/v1')
    >>> parse_uri("/models/weights").scheme
    'file'
    """
    if not uri or any(c.isspace() for c in uri):
        raise ModelSourceError(f"{FIELD} {uri!r}: must be a non-empty URI without spaces")
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if not scheme:
        if not Path(uri).exists() and not uri.startswith(("/", ".")) and uri.count("/") == 1:
            org, name = uri.split("/")
            return ModelUri("hf", org, f"/{name}", uri)  # a bare hub id, ORG/MODEL (local runs)
        return ModelUri("file", "", uri, uri)
    if scheme == "huggingface":
        scheme = "hf"
    if scheme not in SCHEMES:
        raise ModelSourceError(
            f"{FIELD} {uri!r}: scheme {scheme!r} is not one of {', '.join(sorted(SCHEMES))}"
        )
    if scheme == "file":
        return ModelUri("file", "", parsed.path, uri)
    if not parsed.netloc:
        raise ModelSourceError(f"{FIELD} {uri!r}: {_HOST_WORD[scheme]} is missing after {scheme}://")
    if scheme == "hf" and not parsed.path.strip("/"):
        raise ModelSourceError(f"{FIELD} {uri!r}: write hf://ORG/MODEL")
    if scheme == "oci" and not parsed.path.strip("/"):
        raise ModelSourceError(f"{FIELD} {uri!r}: write oci://REGISTRY/REPOSITORY[:TAG|@DIGEST]")
    if scheme in ("http", "https") and not (
        parsed.path.endswith("/") or parsed.path.lower().endswith(ARCHIVE_SUFFIXES)
    ):
        raise ModelSourceError(
            f"{FIELD} {uri!r}: an http(s) URI names a folder (ending in /) or an archive "
            f"({', '.join(ARCHIVE_SUFFIXES)})"
        )
    path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
    return ModelUri(scheme, parsed.netloc, path, uri)


_HOST_WORD = {
    "hf": "the organisation",
    "s3": "the bucket",
    "gs": "the bucket",
    "oci": "the registry",
    "http": "the host",
    "https": "the host",
}


def safe_join(root: Path, relative: str, uri: str) -> Path:
    """root/relative, refusing names that climb out of root (absolute or with ..)."""
    rel = PurePosixPath(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ModelSourceError(f"{FIELD} {uri!r}: refusing the unsafe file name {relative!r}")
    return root.joinpath(*rel.parts)
