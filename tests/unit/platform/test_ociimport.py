"""An import sends a containerd only the layers it lacks: the plan from a docker-archive and the snapshots
the containerd lists, and the OCI layout streamed to `ctr images import -`. Pure parts, on a synthetic
docker-archive (the integration test imports into a real containerd)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest
from chatfleet_platform.cluster import ociimport

pytestmark = pytest.mark.harness  # the local platform's image pipeline (test infrastructure)

REF = "docker.io/chatfleet/chatfleet-runtime:0.1.0-abc"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(name: str, text: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo(name)
        info.size = len(text)
        t.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


def docker_archive(path, layers: list[bytes], ref: str = REF) -> list[str]:
    """A docker-archive as buildah writes one (layers named by diff ID); returns the diff IDs."""
    diff_ids = [sha(x) for x in layers]
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    )
    config_name = sha(config.encode())[7:] + ".json"
    names = [d[7:] + ".tar" for d in diff_ids]
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": names}])
    with tarfile.open(path, "w") as t:
        for name, data in [
            *zip(names, layers, strict=True),
            (config_name, config.encode()),
            ("manifest.json", manifest.encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return diff_ids


def test_chain_ids_are_containerds_snapshot_names():
    a, b, c = "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    abc = "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest()
    assert ociimport.chain_ids([a, b, c]) == [a, ab, abc]
    assert ociimport.chain_ids([]) == []


def test_snapshot_keys_from_ctr_output():
    listing = "KEY                PARENT   KIND\nsha256:aa          -        Committed\nk8s.io/3/x sha256:aa Active\n\n"
    assert ociimport.snapshot_keys(listing) == {"sha256:aa", "k8s.io/3/x"}


def test_only_the_layers_from_the_first_missing_snapshot_are_sent(tmp_path):
    layers = [layer_tar(f"f{i}", "x" * (100 * (i + 1))) for i in range(4)]
    diff_ids = docker_archive(tmp_path / "a.tar", layers)
    chains = ociimport.chain_ids(diff_ids)

    everything = ociimport.plan(tmp_path / "a.tar", REF, set())
    assert [x.digest for x in everything.send] == diff_ids
    assert everything.send_bytes == sum(len(x) for x in layers)

    base_held = ociimport.plan(tmp_path / "a.tar", REF, set(chains[:2]))
    assert [x.digest for x in base_held.send] == diff_ids[2:]
    assert [x.digest for x in base_held.layers] == diff_ids  # the manifest still names every layer

    # a snapshot of a higher layer is no use above a missing one: everything from the gap is sent
    gap = ociimport.plan(tmp_path / "a.tar", REF, {chains[0], chains[2], chains[3]})
    assert [x.digest for x in gap.send] == diff_ids[1:]

    assert ociimport.plan(tmp_path / "a.tar", REF, set(chains)).send == ()


def test_an_archive_without_the_reference_is_an_error_naming_what_it_holds(tmp_path):
    docker_archive(tmp_path / "a.tar", [layer_tar("f", "x")])
    with pytest.raises(ValueError, match=r"holds no image tagged other:1 \(it holds \['docker.io/chatfleet"):
        ociimport.plan(tmp_path / "a.tar", "other:1", set())


def test_the_layout_holds_the_manifest_config_and_only_the_sent_blobs(tmp_path):
    layers = [layer_tar("base", "b" * 300), layer_tar("code", "c" * 20)]
    diff_ids = docker_archive(tmp_path / "a.tar", layers)
    plan = ociimport.plan(tmp_path / "a.tar", REF, {ociimport.chain_ids(diff_ids)[0]})
    out = io.BytesIO()
    ociimport.write_layout(tmp_path / "a.tar", plan, out)

    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers()}
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"] == {"io.containerd.image.name": REF, "org.opencontainers.image.ref.name": REF}
    manifest = files["blobs/sha256/" + entry["digest"][7:]]
    assert sha(manifest) == entry["digest"] and len(manifest) == entry["size"]
    doc = json.loads(manifest)
    assert [(x["digest"], x["size"], x["mediaType"]) for x in doc["layers"]] == [
        (d, len(x), ociimport.LAYER_TYPE) for d, x in zip(diff_ids, layers, strict=True)
    ]
    config = files["blobs/sha256/" + doc["config"]["digest"][7:]]
    assert json.loads(config)["rootfs"]["diff_ids"] == diff_ids
    layer_blobs = {n for n in files if n.startswith("blobs/")} - {
        "blobs/sha256/" + entry["digest"][7:],
        "blobs/sha256/" + doc["config"]["digest"][7:],
    }
    assert layer_blobs == {"blobs/sha256/" + diff_ids[1][7:]}  # the base layer's blob stays home
    assert files["blobs/sha256/" + diff_ids[1][7:]] == layers[1]
    assert ociimport.sent_digests(plan) == [diff_ids[1]]
