"""The real nodes' kept image store: keys name the images with their IDs, a kept root comes back whole,
and a newer build of the same images replaces the older entry, never another set's.

Test design: folders under tmp_path stand in for containerd roots (a marker file travels with them).
"""

from __future__ import annotations

import pytest
from chatfleet_platform import nodestore

pytestmark = pytest.mark.harness

REFS = {
    "pause": {"ref": "registry.k8s.io/pause:3.10", "alias": None, "id": "sha256:p1"},
    "runtime": {"ref": "chatfleet/runtime:0.1.0-a", "alias": "chatfleet/runtime:dev", "id": "sha256:r1"},
}


def root_with(tmp_path, name: str, marker: str):
    root = tmp_path / name / "containerd" / "root"
    root.mkdir(parents=True)
    (root / "marker").write_text(marker)
    return root


def test_the_key_names_the_images_and_changes_with_any_id():
    key = nodestore.key_for(REFS, ["runtime", "pause"])
    assert key.startswith("pause+runtime@") and key == nodestore.key_for(REFS, ["pause", "runtime"])
    rebuilt = {**REFS, "runtime": {**REFS["runtime"], "id": "sha256:r2"}}
    assert nodestore.key_for(rebuilt, ["pause", "runtime"]) != key
    assert nodestore.refs_for(REFS, ["pause", "runtime"]) == (
        "registry.k8s.io/pause:3.10",
        "chatfleet/runtime:0.1.0-a",
        "chatfleet/runtime:dev",
    )


def test_a_kept_root_comes_back_whole_once(tmp_path):
    store, key = tmp_path / "store", nodestore.key_for(REFS, ["pause", "runtime"])
    assert not nodestore.take(key, tmp_path / "n0" / "containerd" / "root", store)  # nothing kept yet
    assert nodestore.keep(key, root_with(tmp_path, "n1", "first run"), store)
    again = tmp_path / "n2" / "containerd" / "root"
    assert nodestore.take(key, again, store) and (again / "marker").read_text() == "first run"
    assert not nodestore.take(key, tmp_path / "n3" / "containerd" / "root", store)  # taken: gone


def test_a_new_build_replaces_the_same_names_entry_only(tmp_path):
    store = tmp_path / "store"
    old = nodestore.key_for(REFS, ["pause", "runtime"])
    pause_only = nodestore.key_for(REFS, ["pause"])
    nodestore.keep(old, root_with(tmp_path, "a", "old"), store)
    nodestore.keep(pause_only, root_with(tmp_path, "b", "pause"), store)
    new = nodestore.key_for({**REFS, "runtime": {**REFS["runtime"], "id": "sha256:r2"}}, ["pause", "runtime"])
    assert nodestore.keep(new, root_with(tmp_path, "c", "new"), store)
    assert sorted(p.name for p in store.iterdir()) == sorted([new, pause_only])


def test_nothing_is_taken_over_an_existing_root(tmp_path):
    store, key = tmp_path / "store", nodestore.key_for(REFS, ["pause"])
    nodestore.keep(key, root_with(tmp_path, "a", "kept"), store)
    existing = root_with(tmp_path, "b", "fresh")
    assert not nodestore.take(key, existing, store) and (existing / "marker").read_text() == "fresh"
