"""The image pipeline end to end on its smallest image: build containerd's pause image with buildah,
export it once per image ID, and import it into a real containerd (own root, state and socket)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from chatfleet_platform.cluster import images

pytestmark = pytest.mark.harness  # tests of the local platform (test infrastructure)


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
    def ctr(*args: str) -> str:
        return subprocess.run(
            ["ctr", "--address", str(containerd), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    blobs = {line.split()[0] for line in ctr("content", "ls").splitlines()[1:] if line.strip()}
    digest = ctr("images", "ls", f"name=={images.PAUSE_REF}").splitlines()[1].split()[2]
    manifest = json.loads(ctr("content", "get", digest))
    layers = {layer["digest"] for layer in manifest["layers"]}
    assert layers and not layers & blobs
    assert manifest["config"]["digest"] in blobs
    assert ctr("snapshots", "ls").splitlines()[1:], "the unpacked snapshot must stay"
