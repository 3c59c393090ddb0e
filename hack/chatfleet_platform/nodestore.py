"""A real node's containerd image store, kept between runs so that the next node skips the import.

Importing the project's images into a new node's containerd unpacks them (the runtime image: 5.8 GB,
two to three minutes on two cores) on every `up`. `down` keeps the node's containerd root instead (once
every container in it is removed and nothing under it is mounted), moved whole into the binary cache
under a key naming the images and their IDs; the next node of the same images moves it back before its
containerd starts and checks that every image is there (else it imports as before). A rebuilt image
has another ID, hence another key: the older entry for the same image names is deleted when the new one
is kept, so the cache holds one unpacked copy per set of names (the real-pod tests' set, and the
life-cycle test's sandbox image alone).

A move (rename) costs nothing on one file system; where the cache is on another one, nothing is kept.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import cache_dir

#: Between the image names and the hash of their IDs in an entry's folder name.
SEP = "@"


@dataclass(frozen=True)
class NodeImages:
    """What a real node gets: `load(socket)` imports the images; `key` names them with their IDs (the
    store's entry); `refs` are the references every node's containerd must list."""

    key: str
    refs: tuple[str, ...]
    load: Callable[[Path], None]


def store_dir() -> Path:
    """Where kept containerd roots live: $CHATFLEET_CACHE/realnode-images."""
    return cache_dir() / "realnode-images"


def key_for(entries: Mapping[str, Mapping[str, object]], names: Sequence[str]) -> str:
    """The entry name of a set of images. Pure.

    e.g. key_for({"pause": {"id": "sha256:1"}}, ["pause"]) == "pause@" + sha1("pause=sha256:1")[:16]
    """
    ordered = sorted(set(names))
    ids = "\n".join(f"{n}={entries[n]['id']}" for n in ordered)
    return "+".join(ordered) + SEP + hashlib.sha1(ids.encode()).hexdigest()[:16]


def refs_for(entries: Mapping[str, Mapping[str, object]], names: Sequence[str]) -> tuple[str, ...]:
    """Every reference (content ref and alias) the images of `names` have in a node. Pure."""
    out: list[str] = []
    for n in names:
        out += [str(entries[n][k]) for k in ("ref", "alias") if entries[n].get(k)]
    return tuple(out)


def take(key: str, root: Path, store: Path | None = None) -> bool:
    """Move the kept root of `key` to `root` (which must not exist yet); False when none is kept."""
    entry = (store or store_dir()) / key
    if not entry.is_dir() or root.exists():
        return False
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(entry, root)
    except OSError:
        return False
    return True


def keep(key: str, root: Path, store: Path | None = None) -> bool:
    """Move `root` into the store as `key`, after deleting the entries of the same image names with
    other IDs; False (and nothing moved) when root is missing or the store is on another file system."""
    store = store or store_dir()
    if not root.is_dir():
        return False
    store.mkdir(parents=True, exist_ok=True)
    names = key.split(SEP, 1)[0]
    for old in store.iterdir():
        if old.name.split(SEP, 1)[0] == names:
            shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(root, store / key)
    except OSError:
        return False
    return True
