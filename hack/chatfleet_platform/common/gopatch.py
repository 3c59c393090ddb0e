"""Mend, in a copy of a Go module's source, a bug of an upstream part before it is built (hack/build-platform.sh).

One mend today, to kwok (the simulated kubelets of the local platform):

* ``kwok ROOT``: kwok's informers (``pkg/utils/informer/event.go``, ``Option.setup``) set
  ``resourceVersion=0`` on every list *and watch* they make. A reflector's watch carries the version it
  has seen, and "0" throws it away, so each re-watch -- every 5 to 10 minutes, when client-go's watch times
  out, and each time the API server closes a watcher that fell behind -- replays every pod on kwok's nodes
  as new, and kwok plays its stages over each again. With ten thousand pods on a saturated machine the
  replays kept kwok behind, so the API server closed its watch every few seconds: kwok's CPU grew about
  fourfold where the run grew 1.8-fold (docs/benchmarks.md). The mend sets "0" only where the caller gave
  no version (a first list, a sync), so a watch resumes where it was; a watch whose version the server
  no longer has is answered 410 and the reflector lists again, as with any client-go informer.

Each mend is an exact edit: the text it replaces must be found exactly once, or it refuses
(``PatchError``), so a new upstream version fails the build with that message instead of building
something else. The command prints one line naming the mends, which the build script keeps beside the
binary as ``patched``: a binary built before a mend (or with another set) has none and is built again.
Standard library only: the build script runs it with the machine's python3, before any venv exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The mends of kwok: (a name, the file, the text it replaces, the text it writes).
KWOK_MENDS = (
    (
        "watch-resume",
        "pkg/utils/informer/event.go",
        '\tif !o.EnableListPager || o.EnableStreamWatch {\n\t\topts.ResourceVersion = "0"\n\t}\n',
        "\t// chatfleet: a reflector's watch carries the version it has seen; resume there, not at 0\n"
        '\tif (!o.EnableListPager || o.EnableStreamWatch) && opts.ResourceVersion == "" {\n'
        '\t\topts.ResourceVersion = "0"\n\t}\n',
    ),
)


class PatchError(Exception):
    """The source is not as this mend expects (an upstream version changed it)."""


def mend(root: Path, mends: tuple[tuple[str, str, str, str], ...] = KWOK_MENDS) -> list[str]:
    """Apply MENDS to the source tree at ROOT; their names. Each edit must match exactly once."""
    done = []
    for name, rel, old, new in mends:
        path = root / rel
        text = path.read_text()
        found = text.count(old)
        if found != 1:
            raise PatchError(f"{name}: {rel} holds the text to replace {found} times, not once")
        path.write_text(text.replace(old, new))
        done.append(name)
    return done


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "kwok":
        print("usage: python3 -m chatfleet_platform.common.gopatch kwok KWOK_ROOT", file=sys.stderr)
        return 2
    try:
        names = mend(Path(argv[1]))
    except (PatchError, OSError) as e:
        print(f"error: kwok: {e}", file=sys.stderr)
        return 1
    print(f"kwok: mended {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
