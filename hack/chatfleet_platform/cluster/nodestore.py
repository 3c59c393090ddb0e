"""A real node's containerd image store, kept between runs so that the next node skips the import.

Importing the project's images into a new node's containerd unpacks them (the runtime image: 5.8 GB,
two to three minutes on two cores) on every `up`. `down` keeps the node's containerd root instead (once
every container in it is removed and nothing under it is mounted), moved whole into the binary cache
under a key naming the images (not their versions); the next node of the same image names moves it back
before its containerd starts, imports only the images whose references it does not list (a rebuilt
operator image: its own import alone; layers it shares with what is there are not unpacked again), and
removes every image no current reference points at, so the store holds one version of each image. The
cache holds one entry per set of names (the real-pod tests' set, and the life-cycle test's sandbox
image alone).

A move (rename) costs nothing on one file system; where the cache is on another one, nothing is kept.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from chatfleet_platform.common.config import cache_dir


@dataclass(frozen=True)
class NodeImages:
    """What a real node gets: `refs` per image name (the references its containerd must list), and
    `load(socket, names)`, which imports the named images into the containerd at socket."""

    refs: Mapping[str, tuple[str, ...]]
    load: Callable[[Path, Sequence[str]], None]

    @property
    def key(self) -> str:
        """The store's entry for these images: their names."""
        return "+".join(sorted(self.refs))

    def missing(self, listing: str) -> list[str]:
        """Names of the images that `ctr images ls` output does not list every reference of. Pure."""
        listed = set(listed_digests(listing))
        return [name for name, refs in self.refs.items() if not set(refs) <= listed]

    def stale(self, listing: str) -> list[str]:
        """References in `ctr images ls` output that point at no image of ours: older builds, and their
        digest and ID references. Pure."""
        digests = listed_digests(listing)
        current = {digests[r] for refs in self.refs.values() for r in refs if r in digests}
        return sorted(r for r, d in digests.items() if d not in current)


def listed_digests(listing: str) -> dict[str, str]:
    """`ctr images ls` output (REF TYPE DIGEST ...) as {reference: manifest digest}. Pure."""
    out = {}
    for line in listing.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3:
            out[cols[0]] = cols[2]
    return out


def store_dir() -> Path:
    """Where kept containerd roots live: $CHATFLEET_CACHE/realnode-images."""
    return cache_dir() / "realnode-images"


def refs_for(entries: Mapping[str, Mapping[str, object]], names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Per image name, its references in a node (the content ref and the alias), from refs.json. Pure."""
    return {n: tuple(str(entries[n][k]) for k in ("ref", "alias") if entries[n].get(k)) for n in names}


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
    """Move `root` into the store as `key` (replacing the entry there); False (and nothing moved) when
    root is missing or the store is on another file system."""
    store = store or store_dir()
    if not root.is_dir():
        return False
    store.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(store / key, ignore_errors=True)
    try:
        os.rename(root, store / key)
    except OSError:
        return False
    return True
