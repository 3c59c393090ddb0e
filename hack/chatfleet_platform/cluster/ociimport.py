"""Import a docker-archive into a containerd, sending only the layers it does not hold yet.

The image cache keeps one docker-archive per image (``images.py``): each layer an uncompressed tar named
by its diff ID, the config, ``manifest.json``. ``ctr images import`` of that archive reads and writes
every layer again, 5.8 GB for the runtime image, though a code change only adds its small top layers and
the node's containerd already holds the rest as snapshots (65-107 s per runtime code change, measured).

Here the archive is turned into an OCI image layout, streamed to ``ctr images import -``: the config, a
manifest naming every layer, and the blobs of the layers from the first one whose snapshot (its chain ID)
the containerd lacks. Unpacking skips a layer whose snapshot exists without reading its blob, so the
omitted blobs are never asked for. The docker-archive format cannot do this (containerd's importer needs
each layer it lists inside the archive); an OCI manifest only names them.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
#: the names containerd's importer gives the image: the full reference, and OCI's own annotation
NAME_ANNOTATIONS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The chain ID of each layer (what a containerd names its committed snapshots): the first layer's
    diff ID, then sha256 of "<parent chain ID> <diff ID>". Pure."""
    out: list[str] = []
    for diff_id in diff_ids:
        if out:
            diff_id = "sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest()
        out.append(diff_id)
    return out


def snapshot_keys(listing: str) -> set[str]:
    """The snapshot keys in `ctr snapshots ls` output (KEY PARENT KIND). Pure."""
    return {line.split()[0] for line in listing.splitlines()[1:] if line.strip()}


@dataclass(frozen=True)
class Layer:
    """One layer of the archive: its diff ID (= digest, uncompressed), size and member name."""

    digest: str
    size: int
    member: str


@dataclass(frozen=True)
class ImportPlan:
    """What goes to the containerd: every layer named in the manifest, the blobs of `send` only."""

    ref: str
    config: bytes
    layers: tuple[Layer, ...]
    send: tuple[Layer, ...]

    @property
    def manifest(self) -> bytes:
        """The OCI manifest (config and every layer, uncompressed)."""
        doc = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": _digest(self.config), "size": len(self.config)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": x.digest, "size": x.size} for x in self.layers],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @property
    def index(self) -> bytes:
        """index.json naming the image by its full reference."""
        manifest = self.manifest
        entry = {
            "mediaType": MANIFEST_TYPE,
            "digest": _digest(manifest),
            "size": len(manifest),
            "annotations": dict.fromkeys(NAME_ANNOTATIONS, self.ref),
        }
        return json.dumps({"schemaVersion": 2, "manifests": [entry]}, separators=(",", ":")).encode()

    @property
    def send_bytes(self) -> int:
        """The layer bytes this import writes into the containerd."""
        return sum(x.size for x in self.send)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def plan(archive: Path, ref: str, have: Iterable[str]) -> ImportPlan:
    """The import of `ref` from the docker-archive at `archive` into a containerd whose snapshots are
    `have`: every layer from the first whose chain ID is not there is sent (a layer above a missing one
    is unpacked onto it, so it needs its blob even if a snapshot of its own diff exists elsewhere)."""
    with tarfile.open(archive) as tar:
        entries = json.load(_member(tar, "manifest.json"))
        entry = next((e for e in entries if ref in (e.get("RepoTags") or [])), None)
        if entry is None:
            tags = [t for e in entries for t in e.get("RepoTags") or []]
            raise ValueError(f"{archive} holds no image tagged {ref} (it holds {tags})")
        config = _member(tar, entry["Config"]).read()
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
        if len(diff_ids) != len(entry["Layers"]):
            raise ValueError(f"{archive}: {len(entry['Layers'])} layer files for {len(diff_ids)} diff IDs")
        layers = tuple(
            Layer(diff_id, tar.getmember(name).size, name)
            for diff_id, name in zip(diff_ids, entry["Layers"], strict=True)
        )
    have = set(have)
    chains = chain_ids(diff_ids)
    first_missing = next((i for i, c in enumerate(chains) if c not in have), len(chains))
    return ImportPlan(ref, config, layers, layers[first_missing:])


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    f = tar.extractfile(name)
    if f is None:
        raise ValueError(f"{tar.name}: {name} is not a file")
    return f


def write_layout(archive: Path, import_plan: ImportPlan, out: IO[bytes]) -> None:
    """Stream the OCI layout of `import_plan` as a tar to `out`: oci-layout, index.json, the manifest and
    config blobs, and the blobs of the layers it sends, copied from the archive's members."""
    blobs = {
        "blobs/sha256/" + _digest(b).removeprefix("sha256:"): b
        for b in (import_plan.manifest, import_plan.config)
    }
    with tarfile.open(fileobj=out, mode="w|") as dst:
        for name, data in [
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", import_plan.index),
            *blobs.items(),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
        with tarfile.open(archive) as src:
            for layer in import_plan.send:
                info = tarfile.TarInfo("blobs/sha256/" + layer.digest.removeprefix("sha256:"))
                info.size = layer.size
                dst.addfile(info, _member(src, layer.member))


def sent_digests(import_plan: ImportPlan) -> Sequence[str]:
    """The layer blobs this import writes (the ones to discard once unpacked)."""
    return [x.digest for x in import_plan.send]
