"""The real nodes' kept image store: a kept root comes back whole under the image names' key; a node
imports only the images its containerd does not list and drops what no current reference points at.

Test design: folders under tmp_path stand in for containerd roots (a marker file travels with them);
`ctr images ls` output is given as text in its real column layout.
"""

from __future__ import annotations

import pytest
from chatfleet_platform.cluster import nodestore

pytestmark = pytest.mark.harness

REFS = {
    "pause": {"ref": "registry.k8s.io/pause:3.10", "alias": None, "id": "sha256:p1"},
    "operator": {"ref": "chatfleet/operator:0.1.0-b", "alias": "chatfleet/operator:dev", "id": "sha256:o2"},
    "runtime": {"ref": "chatfleet/runtime:0.1.0-a", "alias": "chatfleet/runtime:dev", "id": "sha256:r1"},
}
IMAGES = nodestore.NodeImages(nodestore.refs_for(REFS, ["pause", "operator", "runtime"]), lambda s, n: None)
HEADER = "REF                         TYPE                                       DIGEST       SIZE  PLATFORMS   LABELS\n"
MT = "application/vnd.oci.image.manifest.v1+json"


def listing(*rows: tuple[str, str]) -> str:
    return HEADER + "".join(f"{ref} {MT} {digest} 1.0 GiB linux/amd64 -\n" for ref, digest in rows)


def root_with(tmp_path, name: str, marker: str):
    root = tmp_path / name / "containerd" / "root"
    root.mkdir(parents=True)
    (root / "marker").write_text(marker)
    return root


def test_the_key_is_the_image_names_and_the_refs_come_from_refs_json():
    assert IMAGES.key == "operator+pause+runtime"
    assert IMAGES.refs["runtime"] == ("chatfleet/runtime:0.1.0-a", "chatfleet/runtime:dev")
    assert IMAGES.refs["pause"] == ("registry.k8s.io/pause:3.10",)


def test_an_empty_node_imports_everything_and_a_kept_one_only_what_was_rebuilt():
    assert IMAGES.missing("") == ["pause", "operator", "runtime"]
    kept = listing(
        ("registry.k8s.io/pause:3.10", "sha256:d-p"),
        ("chatfleet/operator:0.1.0-a", "sha256:d-o1"),  # the build before
        ("chatfleet/operator:dev", "sha256:d-o1"),
        ("chatfleet/runtime:0.1.0-a", "sha256:d-r"),
        ("chatfleet/runtime:dev", "sha256:d-r"),
    )
    assert IMAGES.missing(kept) == ["operator"]


def test_what_no_current_reference_points_at_is_stale():
    after_import = listing(
        ("registry.k8s.io/pause:3.10", "sha256:d-p"),
        ("sha256:p1", "sha256:d-p"),  # the CRI's ID reference of a current image
        ("chatfleet/operator:0.1.0-a", "sha256:d-o1"),
        ("sha256:o1", "sha256:d-o1"),
        ("chatfleet/operator@sha256:d-o1", "sha256:d-o1"),
        ("chatfleet/operator:0.1.0-b", "sha256:d-o2"),
        ("chatfleet/operator:dev", "sha256:d-o2"),  # the alias moved to the new build
        ("chatfleet/runtime:0.1.0-a", "sha256:d-r"),
        ("chatfleet/runtime:dev", "sha256:d-r"),
    )
    assert IMAGES.missing(after_import) == []
    assert IMAGES.stale(after_import) == [
        "chatfleet/operator:0.1.0-a",
        "chatfleet/operator@sha256:d-o1",
        "sha256:o1",
    ]


def test_a_kept_root_comes_back_whole_once(tmp_path):
    store = tmp_path / "store"
    assert not nodestore.take(IMAGES.key, tmp_path / "n0" / "containerd" / "root", store)  # none kept yet
    assert nodestore.keep(IMAGES.key, root_with(tmp_path, "n1", "first run"), store)
    again = tmp_path / "n2" / "containerd" / "root"
    assert nodestore.take(IMAGES.key, again, store) and (again / "marker").read_text() == "first run"
    assert not nodestore.take(IMAGES.key, tmp_path / "n3" / "containerd" / "root", store)  # taken: gone


def test_keeping_replaces_the_entry_of_the_same_names_only(tmp_path):
    store = tmp_path / "store"
    nodestore.keep(IMAGES.key, root_with(tmp_path, "a", "old"), store)
    nodestore.keep("pause", root_with(tmp_path, "b", "pause"), store)
    assert nodestore.keep(IMAGES.key, root_with(tmp_path, "c", "new"), store)
    assert sorted(p.name for p in store.iterdir()) == sorted([IMAGES.key, "pause"])
    assert (store / IMAGES.key / "marker").read_text() == "new"


def test_nothing_is_taken_over_an_existing_root(tmp_path):
    store = tmp_path / "store"
    nodestore.keep("pause", root_with(tmp_path, "a", "kept"), store)
    existing = root_with(tmp_path, "b", "fresh")
    assert not nodestore.take("pause", existing, store) and (existing / "marker").read_text() == "fresh"
