"""The image pipeline end to end on its smallest image: build containerd's pause image with buildah,
export it once per image ID, and import it into a real containerd (own root, state and socket)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from chatfleet_platform.cluster import images, ociimport

pytestmark = pytest.mark.harness  # tests of the local platform (test infrastructure)


def ctr_in(sock: Path):
    """`ctr` in the k8s.io namespace of the containerd at sock: its stdout."""

    def ctr(*args: str) -> str:
        return subprocess.run(
            ["ctr", "--address", str(sock), "-n", "k8s.io", *args], capture_output=True, text=True, check=True
        ).stdout

    return ctr


@pytest.fixture
def containerd(tmp_path: Path):
    """A throwaway containerd (Debian's) with no CRI plugin; yields its socket."""
    d = tmp_path / "ctrd"
    d.mkdir()
    sock = d / "containerd.sock"
    (d / "config.toml").write_text(
        f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"""
    )
    log = (d / "log").open("w")
    proc = subprocess.Popen(["containerd", "--config", str(d / "config.toml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["ctr", "--address", str(sock), "version"], capture_output=True).returncode:
            assert proc.poll() is None, f"containerd exited: {(d / 'log').read_text()[-2000:]}"
            assert time.monotonic() < deadline, "containerd did not answer within 30s"
            time.sleep(0.2)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_pause_image_builds_once_exports_once_and_loads_into_containerd(tmp_path, containerd):
    cache = tmp_path / "cache"
    builder = images.ImageBuilder(cache=cache, progress=lambda m: None)
    refs = builder.build(["pause"])
    archive = Path(refs["pause"]["archive"])
    assert archive.is_file()
    assert archive == images.archive_path(cache, "pause", refs["pause"]["id"], images.PAUSE_REF)
    first_mtime = archive.stat().st_mtime_ns

    again = images.ImageBuilder(cache=cache, progress=lambda m: None).build(["pause"])
    assert again["pause"] == refs["pause"]
    assert archive.stat().st_mtime_ns == first_mtime  # unchanged image: no new archive
    steps = [r["step"] for r in json.loads((cache / "images" / "build-times.json").read_text())["runs"]]
    assert steps.count("pause") == 1 and steps.count("export-pause") == 1

    took = images.load_images(containerd, names=["pause"], cache=cache, progress=lambda m: None)
    assert set(took) == {"pause"}
    listed = subprocess.run(
        ["ctr", "--address", str(containerd), "-n", "k8s.io", "images", "ls", "-q"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert images.PAUSE_REF in listed

    # the layer blobs are gone once unpacked (the snapshot holds the files); the config blob stays
    ctr = ctr_in(containerd)
    blobs = {line.split()[0] for line in ctr("content", "ls").splitlines()[1:] if line.strip()}
    digest = ctr("images", "ls", f"name=={images.PAUSE_REF}").splitlines()[1].split()[2]
    manifest = json.loads(ctr("content", "get", digest))
    layers = {layer["digest"] for layer in manifest["layers"]}
    assert layers and not layers & blobs
    assert manifest["config"]["digest"] in blobs
    assert ctr("snapshots", "ls").splitlines()[1:], "the unpacked snapshot must stay"


def test_an_image_on_a_base_the_node_holds_sends_only_its_new_layer(tmp_path, containerd):
    """A code change adds a layer on layers the node unpacked before: only that layer's blob is sent, the
    image is listed and its top snapshot sits on the base's."""
    cache = tmp_path / "cache"
    refs = images.ImageBuilder(cache=cache, progress=lambda m: None).build(["pause"])
    images.load_images(containerd, names=["pause"], cache=cache, progress=lambda m: None)

    # the "rebuilt" image: pause's layers plus a small one, in an archive written as buildah writes them
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("app/code.py")
        info.size = 6
        t.addfile(info, io.BytesIO(b"pass\n\n"))
    layer = buf.getvalue()
    layer_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    ref = "localhost/chatfleet/layered:1"
    variant = tmp_path / "variant.tar"
    with tarfile.open(refs["pause"]["archive"]) as src, tarfile.open(variant, "w") as dst:
        (entry,) = json.load(src.extractfile("manifest.json"))
        config = json.loads(src.extractfile(entry["Config"]).read())
        config["rootfs"]["diff_ids"].append(layer_id)
        config_bytes = json.dumps(config).encode()
        config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
        for name in entry["Layers"]:
            dst.addfile(src.getmember(name), src.extractfile(name))
        listing = [
            {"Config": config_name, "RepoTags": [ref], "Layers": [*entry["Layers"], layer_id[7:] + ".tar"]}
        ]
        for name, data in [
            (layer_id[7:] + ".tar", layer),
            (config_name, config_bytes),
            ("manifest.json", json.dumps(listing).encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))

    plan = ociimport.plan(variant, ref, images.node_snapshots(str(containerd)))
    assert [x.digest for x in plan.send] == [layer_id], "the base's layers must stay home"
    images.import_layers(str(containerd), variant, plan)

    ctr = ctr_in(containerd)
    assert ref in ctr("images", "ls", "-q").split()
    chains = ociimport.chain_ids(config["rootfs"]["diff_ids"])
    top = json.loads(ctr("snapshots", "info", chains[-1]))
    assert (top["Kind"], top["Parent"]) == ("Committed", chains[-2])
    blobs = {line.split()[0] for line in ctr("content", "ls").splitlines()[1:] if line.strip()}
    assert layer_id not in blobs  # removed once unpacked, as a full import's are
