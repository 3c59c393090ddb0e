"""Container images built on this machine, with no image registry: `python -m chatfleet_platform.cluster.images`.

Four images, each cached so that unchanged inputs rebuild nothing:

- ``localhost/chatfleet/python-base:bookworm``: a Debian rootfs from ``debootstrap --variant=minbase`` with
  Python 3.11 (the local stand-in for the Dockerfiles' registry bases), keyed by suite + package list;
- ``registry.k8s.io/pause:<version>``: containerd's pod sandbox image, a static ``pause`` from
  ``hack/images/pause.c`` in a scratch image, keyed by the source;
- the operator and runtime images, built by ``buildah bud --layers`` from ``operator/Dockerfile`` and
  ``runtime/Dockerfile`` with only the base swapped by build argument (``PYTHON_IMAGE``, ``TRITON_IMAGE``).
  The Dockerfiles install dependencies in layers that depend on the packages' dependency lists alone (their
  ``pyproject.toml``) and the project's code in a late small layer, so a code change rebuilds one small layer.
  Each is tagged with a hash of its inputs (the files its Dockerfile copies, the base's ID); when that tag is
  in the storage already, nothing runs.

Each image is exported once per image ID to a docker-archive under the cache, and ``load_images`` imports
them into a containerd (``ctr -n k8s.io images import``). What was built is written to ``refs.json`` and
how long each step took to ``build-times.json``, both in ``$CHATFLEET_CACHE/images``.
buildah's storage lives there too (``--root``/``--runroot``), never in ``/var/lib/containers``.

The runtime image is large (torch with its CUDA libraries: about 5.5 GiB unpacked), so the cache keeps only
what the current inputs need: each build drops working containers an interrupted build left, older content
tags of the project images and the layers only they used, and older archives. A node's containerd drops an
image's layer blobs once they are unpacked (containerd's ``discard_unpacked_layers``, done by hand because
``ctr import`` has no such flag), and an import first checks that the node's disk can hold it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from chatfleet_platform.cluster import ociimport
from chatfleet_platform.common.config import REPO_ROOT, PlatformError, cache_dir, read_json, write_json

BASE_SUITE = "bookworm"
# libpython3.11: the Triton Python-backend stub links it; python-is-python3: the operator image runs `python`.
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-pip",
    "python-is-python3",
    "libpython3.11",
    "ca-certificates",
)
BASE_REPO = "localhost/chatfleet/python-base"
BASE_REF = f"{BASE_REPO}:{BASE_SUITE}"
PAUSE_REF = "registry.k8s.io/pause:3.10"
PAUSE_SOURCE = REPO_ROOT / "hack" / "images" / "pause.c"
ALIAS_TAG = "dev"
# buildah's default OCI runtime here (crun 1.8) refuses a hybrid cgroup v1/v2 host; runc works on both.
RUNC = "/usr/sbin/runc"
# Host files that let pip inside a RUN step reach the package registry through this host's TLS setup:
# bind-mounted read-only into the build steps only (never copied into an image), when they exist.
HOST_TLS_FILES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf")
SLIM_PATHS = (
    "var/cache/apt",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
)
KEEP_ARCHIVES = 1
#: Head room left on a node's disk after an import (containerd's metadata, pod logs, emptyDirs).
IMPORT_MARGIN_BYTES = 1 << 30
SKIP_PARTS = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache"})


@dataclass(frozen=True)
class ImageBuild:
    """One project image: its Dockerfile, the build argument that names its base, and its inputs."""

    name: str
    dockerfile: str
    base_arg: str
    repo: str
    inputs: tuple[str, ...]


OPERATOR = ImageBuild(
    name="operator",
    dockerfile="operator/Dockerfile",
    base_arg="PYTHON_IMAGE",
    repo="docker.io/chatfleet/chatfleet-operator",
    inputs=(
        ".dockerignore",
        "operator/Dockerfile",
        "contract/pyproject.toml",
        "operator/pyproject.toml",
        "picker/pyproject.toml",
        "contract/chatfleet_contract",
        "operator/chatfleet_operator",
        "picker/chatfleet_picker",
    ),
)
RUNTIME = ImageBuild(
    name="runtime",
    dockerfile="runtime/Dockerfile",
    base_arg="TRITON_IMAGE",
    repo="docker.io/chatfleet/chatfleet-runtime",
    inputs=(
        ".dockerignore",
        "runtime/Dockerfile",
        "contract/pyproject.toml",
        "runtime/pyproject.toml",
        "contract/chatfleet_contract",
        "runtime/chatfleet_runtime",
    ),
)
PROJECT_IMAGES = (OPERATOR, RUNTIME)
ALL_NAMES = ("base", "pause", "operator", "runtime")
# What a node needs, in import order: containerd's sandbox image before the kubelet starts.
LOAD_ORDER = ("pause", "operator", "runtime")


# ---------------------------------------------------------------- pure parts


def images_dir(cache: Path | None = None) -> Path:
    """The image cache: buildah storage, base rootfs, archives, refs.json, build-times.json."""
    return (cache or cache_dir()) / "images"


def short_hash(data: bytes, n: int = 12) -> str:
    """The first n hex digits of data's SHA-256."""
    return hashlib.sha256(data).hexdigest()[:n]


def base_key(packages: Iterable[str] = BASE_PACKAGES, suite: str = BASE_SUITE) -> str:
    """Cache key of the base rootfs: the suite and the (order-free, de-duplicated) package list."""
    return short_hash(json.dumps([suite, sorted(set(packages))]).encode())


def project_version(pyproject: Path = REPO_ROOT / "operator" / "pyproject.toml") -> str:
    """The project's version: the operator package's (every package carries the same one)."""
    with pyproject.open("rb") as f:
        return tomllib.load(f)["project"]["version"]


def mirror_from_sources(texts: Iterable[str], suite: str = BASE_SUITE) -> str:
    """The Debian archive URI apt uses for suite, from sources.list texts (one-line or deb822 format)."""
    for text in texts:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                if line.startswith("deb ") or line.startswith("deb\t"):
                    parts = [p for p in re.sub(r"\[[^\]]*\]", " ", line[4:]).split()]
                    if len(parts) >= 2 and parts[1] == suite:
                        return parts[0].rstrip("/")
                    continue
                if ":" in line and not line.startswith("deb-src"):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
            types = fields.get("types", "").split()
            if "deb" in types and suite in fields.get("suites", "").split() and fields.get("uris"):
                return fields["uris"].split()[0].rstrip("/")
    raise PlatformError(
        f"no Debian archive for suite {suite!r} in apt's sources (/etc/apt/sources.list*): "
        "debootstrap needs the mirror apt uses"
    )


def read_apt_sources(root: Path = Path("/etc/apt")) -> list[str]:
    """Texts of /etc/apt/sources.list and sources.list.d/*.list|*.sources, in apt's order."""
    files = [root / "sources.list"]
    d = root / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources"))
    return [p.read_text() for p in files if p.is_file()]


def input_files(root: Path, paths: Sequence[str]) -> dict[str, bytes]:
    """Contents of the build inputs under root (files, or folders walked), skipping caches and bytecode."""
    out: dict[str, bytes] = {}
    for rel in paths:
        p = root / rel
        if p.is_file():
            out[rel] = p.read_bytes()
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                parts = f.relative_to(root).parts
                if f.is_file() and not SKIP_PARTS.intersection(parts) and f.suffix != ".pyc":
                    out["/".join(parts)] = f.read_bytes()
        else:
            raise PlatformError(f"image input {rel} is missing under {root}")
    return out


Edit = tuple[str, str, str]
"""(path of a build input, old text, new text)."""


def edited_sources(files: Mapping[str, bytes], edits: Sequence[Edit]) -> dict[str, bytes]:
    """`files` (input_files) with `edits` made in order, each old text found exactly once in its file,
    else a PlatformError naming it (an edit that no longer applies). Pure."""
    out = dict(files)
    for path, old, new in edits:
        if path not in out:
            raise PlatformError(f"edit of {path}: no such build input")
        text = out[path].decode()
        if text.count(old) != 1:
            raise PlatformError(f"edit of {path}: {old!r} found {text.count(old)} times, not once")
        out[path] = text.replace(old, new).encode()
    return out


def content_hash(files: Mapping[str, bytes], extra: Iterable[str] = (), n: int = 10) -> str:
    """A short hash over files (name and content, order-free) and extra strings (base image ID, args)."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    for item in extra:
        h.update(b"\1" + item.encode())
    return h.hexdigest()[:n]


def image_tag(version: str, digest: str) -> str:
    """The content tag of a project image: the project version plus a short content hash."""
    return f"{version}-{digest}"


def buildah_base(storage: Path) -> list[str]:
    """buildah with its storage under the image cache, not /var/lib/containers."""
    return [
        "buildah",
        "--root",
        str(storage / "root"),
        "--runroot",
        str(storage / "run"),
        "--storage-driver",
        "overlay",
    ]


def host_mounts(candidates: Iterable[str], exists: Callable[[str], bool] = os.path.isfile) -> list[str]:
    """`-v host:host:ro` pairs for each candidate file that exists (de-duplicated, in order)."""
    argv: list[str] = []
    seen: set[str] = set()
    for path in candidates:
        if path and path not in seen and exists(path):
            seen.add(path)
            argv += ["-v", f"{path}:{path}:ro"]
    return argv


def tls_candidates(env: Mapping[str, str]) -> list[str]:
    """Host CA bundle and pip config files pip may need inside a build step."""
    return [*HOST_TLS_FILES, env.get("PIP_CERT", ""), env.get("PIP_CONFIG_FILE", "")]


def bud_argv(
    storage: Path,
    build: ImageBuild,
    context: Path,
    base_ref: str,
    tags: Sequence[str],
    iidfile: Path,
    mounts: Sequence[str] = (),
) -> list[str]:
    """`buildah bud` of a project Dockerfile with layer caching, the local base and no registry pulls."""
    argv = [*buildah_base(storage), "bud", "--layers", "--pull=never", "--network", "host"]
    argv += ["-f", str(context / build.dockerfile), "--build-arg", f"{build.base_arg}={base_ref}"]
    for tag in tags:
        argv += ["-t", tag]
    argv += ["--iidfile", str(iidfile), *mounts, str(context)]
    return argv


def debootstrap_argv(rootfs: Path, mirror: str, packages: Iterable[str] = BASE_PACKAGES) -> list[str]:
    """debootstrap of a minimal Debian rootfs with the base packages."""
    include = ",".join(sorted(set(packages)))
    return ["debootstrap", "--variant=minbase", f"--include={include}", BASE_SUITE, str(rootfs), mirror]


def prune_archives(folder: Path, name: str, keep: int) -> list[Path]:
    """Remove all but the newest `keep` archives of image name in folder, and any partial one left by an
    interrupted export; returns the removed ones."""
    found = sorted(folder.glob(f"{name}-*.tar"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    removed = [*found[keep:], *folder.glob(f"{name}-*.tar.partial")]
    for old in removed:
        old.unlink()
    return removed


@contextlib.contextmanager
def cache_lock(cache: Path | None = None, shared: bool = False) -> Iterator[None]:
    """An flock on the image cache: a build holds it alone (refs.json, archives), loads share it, so an
    archive is never pruned while a containerd imports it and two builds never interleave."""
    d = images_dir(cache)
    d.mkdir(parents=True, exist_ok=True)
    with (d / ".lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield


def normalize_id(image_id: str) -> str:
    """An image ID as `sha256:<hex>` (buildah prints it with or without the prefix)."""
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


def archive_path(cache: Path, name: str, image_id: str, ref: str) -> Path:
    """Where the docker-archive of image_id under the name ref lives (one file per image ID and ref)."""
    key = f"{image_id.removeprefix('sha256:')[:16]}-{short_hash(ref.encode(), 8)}"
    return images_dir(cache) / "archives" / f"{name}-{key}.tar"


def push_argv(storage: Path, ref: str, archive: Path | str) -> list[str]:
    """`buildah push` of ref into a docker-archive that names ref."""
    return [*buildah_base(storage), "push", "-q", ref, f"docker-archive:{archive}:{ref}"]


def ctr_argv(address: str, *args: str) -> list[str]:
    """`ctr` against the containerd at address, in its Kubernetes namespace (k8s.io)."""
    return ["ctr", "--address", str(address), "-n", "k8s.io", *args]


def ctr_import_argv(address: str, archive: Path | str) -> list[str]:
    """`ctr images import` of an archive ('-' for stdin) into containerd's Kubernetes namespace."""
    return ctr_argv(address, "images", "import", str(archive))


def stale_tags(tagged: Iterable[str], repo: str, keep: Iterable[str]) -> list[str]:
    """The tags of repo among tagged (``repo:tag`` names) that are not in keep: older content tags."""
    kept = set(keep)
    return sorted(t for t in tagged if t.rpartition(":")[0] == repo and t not in kept)


#: A line of `buildah bud --layers` naming the image a step made ("--> 2b9caf74629": 11 characters, as
#: buildah 1.28 prints some of them) or took from the cache ("--> Using cache <64 characters>")
STEP_IMAGE = re.compile(r"^--> (?:Using cache )?(?:sha256:)?([0-9a-f]{11,64})\s*$")
#: The characters of an image ID that the build's output and `buildah images` both give at least
SHORT_ID = 11


def step_images(lines: Iterable[str]) -> list[str]:
    """The IDs of the layer images a `buildah bud --layers` output says each step made or reused. Pure."""
    return [m.group(1) for m in (STEP_IMAGE.match(line) for line in lines) if m]


def unused_cache_images(dangling: Iterable[str], keep: Iterable[str]) -> list[str]:
    """The untagged images (IDs, full or short) that no kept build used: older builds' steps. Pure."""
    kept = {k.removeprefix("sha256:")[:SHORT_ID] for k in keep}
    return [d for d in dangling if d.removeprefix("sha256:")[:SHORT_ID] not in kept]


def import_space_needed(sizes: Iterable[int], margin: int = IMPORT_MARGIN_BYTES) -> int:
    """Bytes a containerd needs free to import images whose sent layers have these sizes, one by one,
    discarding each image's layer blobs after it is unpacked: every snapshot stays, and the largest is
    briefly held twice (blobs and snapshot)."""
    sizes = list(sizes)
    return sum(sizes) + max(sizes, default=0) + margin


def ctr_tag_argv(address: str, source: str, target: str) -> list[str]:
    """`ctr images tag --force` in containerd's Kubernetes namespace (the stable alias)."""
    return ctr_argv(address, "images", "tag", "--force", source, target)


def build_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment buildah runs with: runc as its OCI runtime unless the caller chose one."""
    out = dict(env)
    out.setdefault("BUILDAH_RUNTIME", RUNC)
    return out


# ---------------------------------------------------------------- the builder


def _say(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def _missing(argv: Sequence[str]) -> PlatformError:
    """The error for a build tool that is not installed."""
    return PlatformError(
        f"{argv[0]} is missing: install the Debian packages buildah, debootstrap, runc and containerd "
        "(`make system-deps`)"
    )


def _failed(argv: Sequence[str], code: int) -> PlatformError:
    """The error for a build command that failed: its first words and exit code."""
    return PlatformError(f"{' '.join(map(str, argv[:8]))} ... failed with exit code {code}")


class ImageBuilder:
    """Builds, exports and records the images; each step is skipped when its inputs are unchanged."""

    def __init__(
        self,
        cache: Path | None = None,
        repo: Path = REPO_ROOT,
        progress: Callable[[str], None] = _say,
    ) -> None:
        self.cache = cache or cache_dir()
        self.dir = images_dir(self.cache)
        self.storage = self.dir / "storage"
        self.repo = repo
        self.say = progress
        self.env = build_env(os.environ)
        self.label = ""

    # -- helpers
    def _run(self, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(list(argv), check=True, env=self.env, **kw)
        except FileNotFoundError as e:
            raise _missing(argv) from e
        except subprocess.CalledProcessError as e:
            raise _failed(argv, e.returncode) from e

    def _buildah(self, *args: str, capture: bool = True) -> str:
        out = self._run([*buildah_base(self.storage), *args], capture_output=capture, text=True)
        return (out.stdout or "").strip()

    def image_id(self, ref: str) -> str | None:
        """The ID of ref in buildah's storage, or None."""
        r = subprocess.run(
            [*buildah_base(self.storage), "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
            capture_output=True,
            text=True,
            env=self.env,
        )
        return normalize_id(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else None

    def _record(self, step: str, seconds: float, **info: object) -> None:
        record_time(self.cache, step, seconds, label=self.label, **info)

    # -- the base
    def build_base(self) -> str:
        """localhost/chatfleet/python-base:bookworm from debootstrap (skipped when the key's image exists)."""
        key = base_key()
        keyed = f"{BASE_REPO}:{BASE_SUITE}-{key}"
        existing = self.image_id(keyed)
        if existing:
            if self.image_id(BASE_REF) != existing:
                self._buildah("tag", keyed, BASE_REF)
            self.say(f"base {BASE_REF} cached (key {key})")
            return existing
        if os.geteuid() != 0:
            raise PlatformError("building the base rootfs needs root (debootstrap, buildah storage)")
        mirror = mirror_from_sources(read_apt_sources())
        t0 = time.monotonic()
        work = self.dir / "rootfs"
        rootfs = work / f"{BASE_SUITE}-{key}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        self.say(f"debootstrap {BASE_SUITE} (minbase + {', '.join(BASE_PACKAGES)}); cold: ~2-3 min")
        self._run(debootstrap_argv(rootfs, mirror), stdout=subprocess.DEVNULL)
        for rel in SLIM_PATHS:
            target = rootfs / rel
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        tarball = work / "rootfs.tar"
        self._run(
            [
                "tar",
                "-C",
                str(rootfs),
                "--numeric-owner",
                "--exclude=./dev/*",
                "--exclude=./proc/*",
                "--exclude=./sys/*",
                "--exclude=./run/*",
                "--exclude=./tmp/*",
                "-cf",
                str(tarball),
                ".",
            ]
        )
        c = self._buildah("from", "scratch")
        try:
            self._buildah("add", c, str(tarball), "/")
            self._buildah(
                "config",
                "--os",
                "linux",
                "--arch",
                "amd64",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--label",
                f"org.chatfleet.base-key={key}",
                "--cmd",
                '["python3"]',
                c,
            )
            self._buildah("commit", "-q", c, keyed)
        finally:
            subprocess.run([*buildah_base(self.storage), "rm", c], capture_output=True, env=self.env)
        self._buildah("tag", keyed, BASE_REF)
        shutil.rmtree(work, ignore_errors=True)
        image_id = self.image_id(BASE_REF) or ""
        self._record("base", time.monotonic() - t0, built=True, image_id=image_id)
        self.say(f"base {BASE_REF} built in {time.monotonic() - t0:.0f}s")
        return image_id

    # -- the pause image
    def build_pause(self) -> str:
        """registry.k8s.io/pause from hack/images/pause.c, static, in a scratch image."""
        key = short_hash(PAUSE_SOURCE.read_bytes() + PAUSE_REF.encode())
        keyed = f"localhost/chatfleet/pause:{key}"
        existing = self.image_id(keyed)
        if existing:
            if self.image_id(PAUSE_REF) != existing:
                self._buildah("tag", keyed, PAUSE_REF)
            self.say(f"pause {PAUSE_REF} cached")
            return existing
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            binary = Path(tmp) / "pause"
            if shutil.which("gcc") is None:
                raise PlatformError(
                    "gcc is missing: it builds the static pause binary (Debian: gcc, libc6-dev)"
                )
            self._run(["gcc", "-Os", "-static", "-s", "-o", str(binary), str(PAUSE_SOURCE)])
            c = self._buildah("from", "scratch")
            try:
                self._buildah("copy", c, str(binary), "/pause")
                self._buildah(
                    "config", "--os", "linux", "--arch", "amd64", "--entrypoint", '["/pause"]', "--cmd", "", c
                )
                self._buildah("commit", "-q", c, keyed)
            finally:
                subprocess.run([*buildah_base(self.storage), "rm", c], capture_output=True, env=self.env)
        self._buildah("tag", keyed, PAUSE_REF)
        image_id = self.image_id(PAUSE_REF) or ""
        self._record("pause", time.monotonic() - t0, built=True, image_id=image_id)
        return image_id

    # -- the project images
    def build_project(self, build: ImageBuild, base_id: str) -> tuple[str, str]:
        """buildah bud --layers of a project Dockerfile on the local base; returns (content ref, image ID)."""
        files = input_files(self.repo, build.inputs)
        digest = content_hash(files, extra=(base_id, BASE_REF))
        ref = f"{build.repo}:{image_tag(project_version(self.repo / 'operator' / 'pyproject.toml'), digest)}"
        alias = f"{build.repo}:{ALIAS_TAG}"
        t0 = time.monotonic()
        previous = self.image_id(ref)
        if previous is not None:
            # made from these very inputs (the ref is their hash): buildah bud would take every step from its
            # layer cache, and still spend seconds checksumming the copied dependency tree
            self._buildah("tag", ref, alias)
            seconds = time.monotonic() - t0
            self._record(build.name, seconds, built=False, image_id=previous, ref=ref)
            self.say(f"{build.name}: {ref} ({previous[:19]}) cached")
            return ref, previous
        mounts = host_mounts(tls_candidates(os.environ))
        with tempfile.TemporaryDirectory() as tmp:
            iid = Path(tmp) / "iid"
            self.say(f"{build.name}: buildah bud --layers {build.dockerfile} -> {ref}")
            before = self._image_ids()
            reused = self._bud(bud_argv(self.storage, build, self.repo, BASE_REF, (ref, alias), iid, mounts))
            image_id = normalize_id(iid.read_text().strip())
            # the steps it took from the cache, and those it made (buildah prints no ID for most of these)
            made = sorted(self._image_ids() - before)
        self._keep_cache(build.name, [*reused, *made, image_id])
        seconds = time.monotonic() - t0
        self._record(build.name, seconds, built=True, image_id=image_id, ref=ref)
        self.say(f"{build.name}: {ref} ({image_id[:19]}) in {seconds:.1f}s")
        return ref, image_id

    def build_edited_into(
        self, address: str | Path, build: ImageBuild, tag: str, edits: Sequence[Edit]
    ) -> str:
        """Another build of `build`, from its sources with `edits` made (edited_sources), as a release of
        changed code is built: the same Dockerfile, base and layer cache (only the steps after the changed
        files run). Tagged `<repo>:<tag>` and imported into the containerd at `address` (the layers it
        lacks: the changed ones) through an archive that is removed after. Returns the ref. The project's
        images and refs.json stay as `build()` made them; the base must exist (`build()` first)."""
        ref = f"{build.repo}:{tag}"
        files = edited_sources(input_files(self.repo, build.inputs), edits)
        t0 = time.monotonic()
        with cache_lock(self.cache), tempfile.TemporaryDirectory(dir=self.dir) as tmp:
            context = Path(tmp) / "src"
            for rel, data in files.items():
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                (context / rel).write_bytes(data)
            iid, archive = Path(tmp) / "iid", Path(tmp) / "image.tar"
            mounts = host_mounts(tls_candidates(os.environ))
            self.say(
                f"{build.name}: buildah bud --layers {build.dockerfile}, {', '.join(sorted({e[0] for e in edits}))} edited -> {ref}"
            )
            self._bud(bud_argv(self.storage, build, context, BASE_REF, (ref,), iid, mounts))
            self._run(push_argv(self.storage, ref, archive))
            import_plan = ociimport.plan(archive, ref, node_snapshots(str(address)))
            import_layers(str(address), archive, import_plan)
        self.say(
            f"{ref} built and imported into {address} in {time.monotonic() - t0:.1f}s "
            f"({len(import_plan.send)} of {len(import_plan.layers)} layers sent)"
        )
        return ref

    def _bud(self, argv: Sequence[str]) -> list[str]:
        """Run `buildah bud`, its output passed through; the IDs of the step images its output names (every
        step taken from the cache; of the steps made, only some)."""
        try:
            proc = subprocess.Popen(
                list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env
            )
        except FileNotFoundError as e:
            raise _missing(argv) from e
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line)
        if proc.wait() != 0:
            raise _failed(argv, proc.returncode)
        return step_images(lines)

    def _keep_cache(self, name: str, ids: Sequence[str]) -> None:
        """Record the step images of name's newest build: its layer cache, which drop_older keeps."""
        path = self.dir / "cache-images.json"
        kept = read_json(path)
        kept[name] = list(ids)
        write_json(path, kept)

    def _image_ids(self) -> set[str]:
        """The IDs of every image in buildah's storage, intermediate ones included."""
        return set(
            self._buildah("images", "--all", "--noheading", "--no-trunc", "--format", "{{.ID}}").split()
        )

    def _dangling(self) -> list[str]:
        """The IDs of buildah's untagged leaf images (no tag, no child)."""
        return self._buildah(
            "images", "--filter", "dangling=true", "--noheading", "--format", "{{.ID}}"
        ).split()

    def drop_older(self, build: ImageBuild, ref: str) -> list[str]:
        """Untag the older content tags of build's repository, and remove the untagged images that no
        project image's newest build used (older builds' steps). The newest builds' steps stay: they are
        the layer cache. (`buildah rmi --prune` took them too: the operator's requirements stage, which no
        tagged image descends from, went with it, and the next build of the same sources, the real-pod
        tests' own, installed every dependency again: 99-116 s after each operator change, measured.)"""
        listing = self._buildah("images", "--format", "{{.Name}}:{{.Tag}}")
        stale = stale_tags(listing.splitlines(), build.repo, (ref, f"{build.repo}:{ALIAS_TAG}"))
        if stale:
            self._buildah("rmi", *stale)
            keep = [i for ids in read_json(self.dir / "cache-images.json").values() for i in ids]
            # untagged leaves only: removing an older build's last step makes its parent one, so repeat
            # until none is left, or until a round removes nothing (an image still in use)
            unused = unused_cache_images(self._dangling(), keep)
            for _ in range(64):  # a build has a few dozen steps at most
                if not unused:
                    break
                subprocess.run(
                    [*buildah_base(self.storage), "rmi", *unused], capture_output=True, env=self.env
                )
                left = unused_cache_images(self._dangling(), keep)
                if set(left) >= set(unused):
                    break
                unused = left
            self.say(f"{build.name}: dropped {len(stale)} older tag(s) and the layers only older builds used")
        return stale

    # -- export
    def export(self, name: str, ref: str, image_id: str) -> Path:
        """A docker-archive of ref, once per image ID (only the newest KEEP_ARCHIVES per image are kept)."""
        path = archive_path(self.cache, name, image_id, ref)
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        # the runtime's archive is ~5.8 GB: older ones go before the new one is written
        prune_archives(path.parent, name, KEEP_ARCHIVES - 1)
        t0 = time.monotonic()
        partial = path.with_suffix(".tar.partial")
        self._run(push_argv(self.storage, ref, partial))
        partial.rename(path)
        self._record(
            f"export-{name}",
            time.monotonic() - t0,
            image_id=image_id,
            bytes=path.stat().st_size,
            archive=str(path),
        )
        return path

    def build(self, names: Sequence[str] = ALL_NAMES) -> dict[str, dict]:
        """Build (or find cached) the named images, export them and update refs.json; returns its entries."""
        unknown = set(names) - set(ALL_NAMES)
        if unknown:
            raise PlatformError(f"unknown image(s) {sorted(unknown)}: choose from {', '.join(ALL_NAMES)}")
        need = {"buildah": "buildah", RUNC: "runc"}
        if set(names) - {"pause"}:
            need["debootstrap"] = "debootstrap"
        if "pause" in names:
            need["gcc"] = "gcc"
        missing = sorted(pkg for tool, pkg in need.items() if shutil.which(tool) is None)
        if missing:
            raise PlatformError(
                f"missing tools for the image build: install the Debian packages {', '.join(missing)}"
            )
        with cache_lock(self.cache):
            return self._build_locked(names)

    def _build_locked(self, names: Sequence[str]) -> dict[str, dict]:
        refs_path = self.dir / "refs.json"
        refs = read_json(refs_path)
        # working containers left by an interrupted build hold whole layers (one held 11 GB)
        subprocess.run([*buildah_base(self.storage), "rm", "--all"], capture_output=True, env=self.env)
        base_id = self.build_base() if set(names) - {"pause"} else ""
        if "pause" in names:
            pid = self.build_pause()
            refs["pause"] = {"ref": PAUSE_REF, "alias": None, "id": pid}
        built = [build for build in PROJECT_IMAGES if build.name in names]
        for build in built:
            ref, iid = self.build_project(build, base_id)
            refs[build.name] = {"ref": ref, "alias": f"{build.repo}:{ALIAS_TAG}", "id": iid}
        for build in built:  # once every build has said which step images it used
            self.drop_older(build, refs[build.name]["ref"])
        for name in LOAD_ORDER:
            entry = refs.get(name)
            if name in names and entry:
                entry["archive"] = str(self.export(name, entry["ref"], entry["id"]))
        write_json(refs_path, refs)
        return refs


# ---------------------------------------------------------------- loading into a node


def read_refs(cache: Path | None = None) -> dict[str, dict]:
    """refs.json: per image, its content ref, stable alias, image ID and archive path."""
    path = images_dir(cache) / "refs.json"
    if not path.is_file():
        raise PlatformError(f"no images built yet ({path} is missing): run `make images`")
    return json.loads(path.read_text())


def _archive(refs: Mapping[str, dict], name: str, cache: Path | None) -> Path:
    """The docker-archive of the built image `name`; a PlatformError when it has none."""
    entry = refs.get(name)
    if not entry or not entry.get("archive") or not Path(entry["archive"]).is_file():
        raise PlatformError(f"image {name!r} has no archive in {images_dir(cache)}: run `make images`")
    return Path(entry["archive"])


def load_images(
    address: str | Path,
    names: Sequence[str] = LOAD_ORDER,
    cache: Path | None = None,
    progress: Callable[[str], None] = _say,
    label: str = "",
) -> dict[str, float]:
    """Import the built images (pause first) into the containerd at address; returns seconds per image."""
    with cache_lock(cache, shared=True):
        return _load_locked(address, names, cache, progress, label)


def _load_locked(
    address: str | Path,
    names: Sequence[str],
    cache: Path | None,
    progress: Callable[[str], None],
    label: str,
) -> dict[str, float]:
    refs = read_refs(cache)
    took: dict[str, float] = {}
    archives: dict[str, Path] = {}
    for name in names:
        archives[name] = _archive(refs, name, cache)
    have = node_snapshots(str(address))
    plans = {name: ociimport.plan(archives[name], refs[name]["ref"], have) for name in names}
    check_import_space(Path(address).parent, {n: p.send_bytes for n, p in plans.items()})
    for name in names:
        entry, import_plan = refs[name], plans[name]
        t0 = time.monotonic()
        import_layers(str(address), archives[name], import_plan)
        if entry.get("alias"):
            _check(ctr_tag_argv(str(address), entry["ref"], entry["alias"]))
        took[name] = round(time.monotonic() - t0, 1)
        record_time(
            cache,
            f"import-{name}",
            took[name],
            label=label,
            image_id=entry["id"],
            address=str(address),
            layers_sent=len(import_plan.send),
            bytes_sent=import_plan.send_bytes,
        )
        gib = import_plan.send_bytes / (1 << 30)
        progress(
            f"imported {entry['ref']} into {address} in {took[name]}s "
            f"({len(import_plan.send)} of {len(import_plan.layers)} layers sent, {gib:.2f} GiB)"
        )
    return took


def node_snapshots(address: str) -> set[str]:
    """The snapshot keys (chain IDs of unpacked layers) of the containerd at address."""
    listed = subprocess.run(ctr_argv(address, "snapshots", "ls"), capture_output=True, text=True)
    if listed.returncode != 0:
        raise PlatformError(f"cannot list the snapshots of {address}: {listed.stderr.strip()[-300:]}")
    return ociimport.snapshot_keys(listed.stdout)


def import_layers(address: str, archive: Path, import_plan: ociimport.ImportPlan) -> None:
    """`ctr images import -` of the plan's OCI layout (streamed from the archive), unpacked; then the
    layer blobs it wrote are removed (the snapshots hold the files)."""
    proc = subprocess.Popen(
        ctr_import_argv(address, "-"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None
    try:
        ociimport.write_layout(archive, import_plan, proc.stdin)
    except BrokenPipeError:
        pass  # ctr stopped reading: its exit status and stderr say why
    out, err = proc.communicate()  # closes ctr's stdin: the end of the layout
    if proc.returncode != 0:
        raise PlatformError(
            f"ctr images import of {import_plan.ref} into {address} failed (exit {proc.returncode}): "
            f"{(err or out).decode(errors='replace').strip()[-600:]}"
        )
    sent = ociimport.sent_digests(import_plan)
    if sent:
        _check(ctr_argv(address, "content", "rm", *sent))


def check_import_space(folder: Path, sizes: Mapping[str, int]) -> None:
    """Raise a PlatformError naming the images and the shortfall when folder's disk cannot hold them."""
    need = import_space_needed(sizes.values())
    free = shutil.disk_usage(folder).free
    if free < need:
        gib = 1 << 30
        listed = ", ".join(f"{n} {s / gib:.1f} GiB" for n, s in sizes.items())
        raise PlatformError(
            f"not enough disk to import the images into the containerd under {folder}: it needs about "
            f"{need / gib:.1f} GiB free ({listed}, unpacked once, plus the largest briefly twice and "
            f"{IMPORT_MARGIN_BYTES / gib:.0f} GiB head room) and {free / gib:.1f} GiB is free. Free some disk "
            "(the image cache keeps one version per image under $CHATFLEET_CACHE/images) and run again."
        )


def record_time(cache: Path | None, step: str, seconds: float, label: str = "", **info: object) -> None:
    """Add a timing to build-times.json: `latest[step]`, the `runs` list, and `measured[step_label]`."""
    path = images_dir(cache) / "build-times.json"
    data = read_json(path)
    row: dict[str, object] = {
        "step": step,
        "seconds": round(seconds, 1),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **info,
    }
    if label:
        row["label"] = label
        data.setdefault("measured", {})[f"{step}_{label}"] = row
    data["runs"] = [*data.get("runs", []), row][-200:]
    data.setdefault("latest", {})[step] = row
    write_json(path, data)


def _check(argv: Sequence[str]) -> None:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if r.returncode != 0:
        raise PlatformError(f"{' '.join(argv)} failed: {(r.stderr or r.stdout).strip()[-800:]}")


def main(argv: list[str] | None = None) -> int:
    """`build [NAMES]`, `load --address SOCK [NAMES]`, `refs`; returns the exit code."""
    ap = argparse.ArgumentParser(prog="chatfleet-images", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or find cached) and export the images")
    b.add_argument("names", nargs="*", default=list(ALL_NAMES), help=f"some of: {' '.join(ALL_NAMES)}")
    b.add_argument("--label", default="", help="also record the timings under measured.<step>_<label>")
    ld = sub.add_parser("load", help="import the images into a containerd (pause first)")
    ld.add_argument("--address", required=True, help="containerd's socket")
    ld.add_argument("names", nargs="*", default=list(LOAD_ORDER))
    ld.add_argument("--label", default="", help="also record the timings under measured.<step>_<label>")
    sub.add_parser("refs", help="print refs.json")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            builder = ImageBuilder()
            builder.label = args.label
            refs = builder.build(args.names)
            for name, entry in refs.items():
                print(f"{name:9} {entry['ref']}  {entry.get('archive', '')}")
        elif args.cmd == "load":
            load_images(args.address, args.names, label=args.label)
        else:
            print(json.dumps(read_refs(), indent=2))
    except PlatformError as e:
        print(f"[images] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
