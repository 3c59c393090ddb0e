"""The local image build's pure parts: cache keys, tags, argv (the Dockerfiles: tests/unit/test_dockerfiles.py)."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from chatfleet_platform.cluster import images
from chatfleet_platform.common.config import REPO_ROOT, PlatformError

pytestmark = pytest.mark.harness  # tests of the local platform (test infrastructure)


# ------------------------------------------------------------ cache keys and tags


def test_base_key_ignores_order_and_duplicates_but_not_content():
    key = images.base_key(["python3", "ca-certificates"], "bookworm")
    assert key == images.base_key(["ca-certificates", "python3", "python3"], "bookworm")
    assert key != images.base_key(["python3", "ca-certificates", "libpython3.11"], "bookworm")
    assert key != images.base_key(["python3", "ca-certificates"], "trixie")
    assert re.fullmatch(r"[0-9a-f]{12}", key)


def test_base_packages_carry_what_the_images_need():
    # libpython: the Triton Python-backend stub links it; python-is-python3: the operator image runs `python`.
    for pkg in (
        "python3",
        "python3-venv",
        "python3-pip",
        "python-is-python3",
        "libpython3.11",
        "ca-certificates",
    ):
        assert pkg in images.BASE_PACKAGES


def test_content_hash_follows_names_contents_and_base():
    files = {"a.py": b"x = 1\n", "b/c.py": b"y = 2\n"}
    h = images.content_hash(files, extra=("sha256:base1",))
    assert h == images.content_hash(dict(reversed(list(files.items()))), extra=("sha256:base1",))
    assert h != images.content_hash({**files, "a.py": b"x = 2\n"}, extra=("sha256:base1",))
    assert h != images.content_hash({"a2.py": b"x = 1\n", "b/c.py": b"y = 2\n"}, extra=("sha256:base1",))
    assert h != images.content_hash(files, extra=("sha256:base2",))
    assert images.image_tag("0.1.0", h) == f"0.1.0-{h}"


def test_input_files_skip_bytecode_and_caches(tmp_path):
    pkg = tmp_path / "runtime" / "chatfleet_runtime"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "api.py").write_text("print(1)\n")
    (pkg / "__pycache__" / "api.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    before = images.content_hash(
        images.input_files(tmp_path, ["pyproject.toml", "runtime/chatfleet_runtime"])
    )
    (pkg / "__pycache__" / "other.pyc").write_bytes(b"\1")
    files = images.input_files(tmp_path, ["pyproject.toml", "runtime/chatfleet_runtime"])
    assert sorted(files) == ["pyproject.toml", "runtime/chatfleet_runtime/api.py"]
    assert images.content_hash(files) == before
    (pkg / "api.py").write_text("print(2)\n")
    assert images.content_hash(images.input_files(tmp_path, ["runtime/chatfleet_runtime"])) != before


def test_input_files_name_a_missing_input(tmp_path):
    with pytest.raises(PlatformError, match="image input operator/Dockerfile is missing"):
        images.input_files(tmp_path, ["operator/Dockerfile"])


def test_project_image_inputs_exist_in_the_repository():
    for build in images.PROJECT_IMAGES:
        assert images.input_files(REPO_ROOT, build.inputs)


def test_archive_is_keyed_by_image_id_and_ref(tmp_path):
    ref = "docker.io/chatfleet/chatfleet-runtime:0.1.0-abc"
    a = images.archive_path(tmp_path, "runtime", "sha256:" + "ab" * 32, ref)
    assert a.parent == tmp_path / "images" / "archives"
    assert re.fullmatch(rf"runtime-{'ab' * 8}-[0-9a-f]{{8}}\.tar", a.name)
    assert a == images.archive_path(tmp_path, "runtime", "ab" * 32, ref)
    assert a != images.archive_path(tmp_path, "runtime", "sha256:" + "cd" * 32, ref)
    # the archive names the image: the same image under a new tag is a new archive
    assert a != images.archive_path(tmp_path, "runtime", "sha256:" + "ab" * 32, ref + "x")


def test_project_version_is_pyprojects():
    with (REPO_ROOT / "operator" / "pyproject.toml").open("rb") as f:
        assert images.project_version() == tomllib.load(f)["project"]["version"]


# ------------------------------------------------------------ apt sources


def test_mirror_from_deb822_sources():
    text = (
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    assert images.mirror_from_sources([text]) == "http://mirror.example/debian"


def test_mirror_from_one_line_sources_skips_other_suites_and_options():
    texts = [
        "deb [signed-by=/k.gpg] https://other.example/apt cloud-sdk-bookworm main\n",
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64] http://mirror.example/debian bookworm main\n",
    ]
    assert images.mirror_from_sources(texts) == "http://mirror.example/debian"


def test_mirror_missing_is_a_clear_error():
    with pytest.raises(PlatformError, match="no Debian archive for suite 'bookworm'"):
        images.mirror_from_sources(["Types: deb\nURIs: http://x.example/d\nSuites: trixie\n"])


def test_read_apt_sources_reads_list_and_sources_files(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("deb http://a.example/debian bookworm main\n")
    (tmp_path / "sources.list.d" / "z.sources").write_text("Types: deb\n")
    (tmp_path / "sources.list.d" / "ignored.save").write_text("nope")
    assert images.read_apt_sources(tmp_path) == [
        "deb http://a.example/debian bookworm main\n",
        "Types: deb\n",
    ]


# ------------------------------------------------------------ argv


def test_bud_argv_uses_layers_the_local_base_and_no_registry(tmp_path):
    argv = images.bud_argv(
        tmp_path / "s",
        images.OPERATOR,
        Path("/repo"),
        images.BASE_REF,
        ("docker.io/chatfleet/chatfleet-operator:0.1.0-abc", "docker.io/chatfleet/chatfleet-operator:dev"),
        tmp_path / "iid",
        ["-v", "/etc/pip.conf:/etc/pip.conf:ro"],
    )
    assert argv[:7] == [
        "buildah",
        "--root",
        str(tmp_path / "s" / "root"),
        "--runroot",
        str(tmp_path / "s" / "run"),
        "--storage-driver",
        "overlay",
    ]
    assert argv[7:11] == ["bud", "--layers", "--pull=never", "--network"]
    joined = " ".join(argv)
    assert "-f /repo/operator/Dockerfile" in joined
    assert "--build-arg PYTHON_IMAGE=localhost/chatfleet/python-base:bookworm" in joined
    assert (
        "-t docker.io/chatfleet/chatfleet-operator:0.1.0-abc -t docker.io/chatfleet/chatfleet-operator:dev"
        in joined
    )
    assert f"--iidfile {tmp_path / 'iid'}" in joined
    assert argv[-3:] == ["-v", "/etc/pip.conf:/etc/pip.conf:ro", "/repo"]
    rt = images.bud_argv(tmp_path, images.RUNTIME, Path("/repo"), "b:1", ("r:1",), tmp_path / "i")
    assert "--build-arg TRITON_IMAGE=b:1" in " ".join(rt)


def test_host_mounts_only_existing_files_once():
    present = {"/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf"}
    argv = images.host_mounts(
        ["/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf", "/nope", "", "/etc/pip.conf"],
        exists=present.__contains__,
    )
    assert argv == [
        "-v",
        "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro",
        "-v",
        "/etc/pip.conf:/etc/pip.conf:ro",
    ]
    assert "/x/ca.pem" in images.tls_candidates({"PIP_CERT": "/x/ca.pem"})


def test_debootstrap_argv():
    argv = images.debootstrap_argv(
        Path("/c/rootfs"), "http://m.example/debian", ["python3", "ca-certificates"]
    )
    assert argv == [
        "debootstrap",
        "--variant=minbase",
        "--include=ca-certificates,python3",
        "bookworm",
        "/c/rootfs",
        "http://m.example/debian",
    ]


def test_push_and_ctr_argv(tmp_path):
    ref = "docker.io/chatfleet/chatfleet-runtime:0.1.0-abc"
    push = images.push_argv(tmp_path, ref, "/c/runtime-1.tar")
    assert push[-4:] == ["push", "-q", ref, f"docker-archive:/c/runtime-1.tar:{ref}"]
    assert images.ctr_import_argv("/run/n/containerd.sock", "/c/runtime-1.tar") == [
        "ctr",
        "--address",
        "/run/n/containerd.sock",
        "-n",
        "k8s.io",
        "images",
        "import",
        "/c/runtime-1.tar",
    ]
    assert images.ctr_tag_argv("/s", ref, "r:dev")[-4:] == ["tag", "--force", ref, "r:dev"]


def test_build_env_defaults_to_runc_but_respects_a_choice():
    assert images.build_env({})["BUILDAH_RUNTIME"] == "/usr/sbin/runc"
    assert images.build_env({"BUILDAH_RUNTIME": "/x/crun"})["BUILDAH_RUNTIME"] == "/x/crun"


def test_load_without_a_build_names_make_images(tmp_path):
    with pytest.raises(PlatformError, match="run `make images`"):
        images.load_images("/nope.sock", cache=tmp_path)


def test_load_order_puts_the_sandbox_image_first():
    assert images.LOAD_ORDER[0] == "pause"


def test_image_ids_are_normalized():
    assert images.normalize_id("ab" * 32) == "sha256:" + "ab" * 32
    assert images.normalize_id("sha256:" + "ab" * 32) == "sha256:" + "ab" * 32


def test_build_times_keep_latest_runs_and_labelled_measurements(tmp_path):
    images.record_time(tmp_path, "runtime", 401.25, label="cold", image_id="sha256:1")
    images.record_time(tmp_path, "runtime", 3.04, image_id="sha256:1")
    data = json.loads((tmp_path / "images" / "build-times.json").read_text())
    assert data["latest"]["runtime"]["seconds"] == 3.0
    assert data["measured"]["runtime_cold"]["seconds"] == 401.2
    assert [r["seconds"] for r in data["runs"]] == [401.2, 3.0]


def test_prune_keeps_the_newest_archives_of_that_image_only(tmp_path):
    for i, name in enumerate(["runtime-a.tar", "runtime-c.tar.partial", "runtime-b.tar", "operator-a.tar"]):
        (tmp_path / name).write_text(name)
        os.utime(tmp_path / name, ns=(i * 10**9, i * 10**9))
    removed = images.prune_archives(tmp_path, "runtime", 1)
    assert sorted(p.name for p in removed) == ["runtime-a.tar", "runtime-c.tar.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["operator-a.tar", "runtime-b.tar"]


def test_cache_lock_excludes_a_second_builder(tmp_path):
    code = (
        "import fcntl, sys; f = open(sys.argv[1], 'a')\n"
        "try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
        "except BlockingIOError: print('held')"
    )
    lock = tmp_path / "images" / ".lock"
    probe = [sys.executable, "-c", code, str(lock)]
    with images.cache_lock(tmp_path):
        assert subprocess.run(probe, capture_output=True, text=True).stdout.strip() == "held"
    assert subprocess.run(probe, capture_output=True, text=True).stdout.strip() == "free"


def test_project_image_inputs_hold_every_folder_its_dockerfile_copies():
    # the inputs key the image cache: a copied folder left out would not rebuild the image when it changes
    for build in images.PROJECT_IMAGES:
        dockerfile = (REPO_ROOT / build.dockerfile).read_text()
        copied = set(re.findall(r"^COPY (?!--from)(\S+?)/? \S+$", dockerfile, re.M))
        assert copied and copied <= set(build.inputs), (build.name, sorted(copied - set(build.inputs)))


def test_stale_tags_are_the_repositorys_other_tags():
    tagged = [
        "docker.io/chatfleet/chatfleet-runtime:dev",
        "docker.io/chatfleet/chatfleet-runtime:0.1.0-new",
        "docker.io/chatfleet/chatfleet-runtime:0.1.0-old",
        "docker.io/chatfleet/chatfleet-operator:0.1.0-old",
        "<none>:<none>",
    ]
    keep = ("docker.io/chatfleet/chatfleet-runtime:0.1.0-new", "docker.io/chatfleet/chatfleet-runtime:dev")
    assert images.stale_tags(tagged, "docker.io/chatfleet/chatfleet-runtime", keep) == [
        "docker.io/chatfleet/chatfleet-runtime:0.1.0-old"
    ]


def test_import_space_counts_every_snapshot_and_the_largest_image_twice():
    assert images.import_space_needed([10, 300, 5], margin=1) == 10 + 300 + 5 + 300 + 1
    assert images.import_space_needed([], margin=7) == 7


def test_import_refuses_a_disk_too_small_and_names_the_images(tmp_path, monkeypatch):
    monkeypatch.setattr(images.shutil, "disk_usage", lambda p: type("U", (), {"free": 2 << 30})())
    with pytest.raises(images.PlatformError) as err:
        images.check_import_space(tmp_path, {"runtime": 5 << 30, "pause": 1 << 20})
    text = str(err.value)
    assert "runtime 5.0 GiB" in text and "2.0 GiB is free" in text and str(tmp_path) in text
    images.check_import_space(tmp_path, {"pause": 1 << 20})  # fits: no error


def test_step_images_are_read_from_the_builds_output():
    out = [
        "[1/4] STEP 2/5: WORKDIR /src\n",
        "--> Using cache 2814acf89ba5b3a3d1dc0e3b2afa70ebb626b1bd3efc9e85d6d6f0ada68c0c8c\n",
        "[1/4] STEP 3/5: COPY operator/pyproject.toml operator/\n",
        "--> 2b9caf74629\n",  # a step built now: buildah prints 11 characters
        "COMMIT docker.io/chatfleet/chatfleet-operator:0.1.0-abc\n",
        "--> sha256:76c3a1ba3223aa\n",
        "--> not an id\n",
    ]
    assert images.step_images(out) == [
        "2814acf89ba5b3a3d1dc0e3b2afa70ebb626b1bd3efc9e85d6d6f0ada68c0c8c",
        "2b9caf74629",
        "76c3a1ba3223aa",
    ]


def test_only_untagged_images_no_newest_build_used_are_dropped():
    """An older build's steps go; the newest builds' steps stay (the layer cache), short or full IDs."""
    keep = ["a09a7cfa01423de33f57b1f27d7061cc7f16d81281a409f64a45635b14fcea22", "sha256:6a0466b33330ff"]
    keep.append("2b9caf74629")  # a step built now, as its build printed it (11 characters)
    dangling = ["6a0466b33330", "a09a7cfa0142", "88fb9eb0b7fc", "5e1454c207d8", "2b9caf746291"]
    assert images.unused_cache_images(dangling, keep) == ["88fb9eb0b7fc", "5e1454c207d8"]
    assert images.unused_cache_images([], keep) == []


def test_an_edited_build_changes_only_the_edited_files_and_refuses_an_edit_that_no_longer_applies():
    files = {"op/settings.py": b'cpu = "500m"\nmemory = "512Mi"\n', "op/other.py": b"x = 1\n"}
    out = images.edited_sources(
        files, [("op/settings.py", 'cpu = "500m"', 'cpu = "150m"'), ("op/settings.py", '"512Mi"', '"24Mi"')]
    )
    assert out == {"op/settings.py": b'cpu = "150m"\nmemory = "24Mi"\n', "op/other.py": b"x = 1\n"}
    assert files["op/settings.py"] == b'cpu = "500m"\nmemory = "512Mi"\n'  # the sources themselves unchanged
    with pytest.raises(PlatformError, match="found 0 times, not once"):
        images.edited_sources(files, [("op/settings.py", 'cpu = "1"', "")])
    with pytest.raises(PlatformError, match="no such build input"):
        images.edited_sources(files, [("op/gone.py", "x", "y")])


def test_the_upgrade_benchs_builds_edit_the_operators_own_settings():
    """bench-chaos-upgrades builds its operator versions by editing the defaults in settings.py: the edits
    must still apply to the operator's sources as they are (else the bench fails after its setup)."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    import upgrade_bench

    files = images.input_files(REPO_ROOT, images.OPERATOR.inputs)
    for build in upgrade_bench.BUILDS:
        edited = images.edited_sources(files, upgrade_bench.build_edits(build))
        assert edited[upgrade_bench.SETTINGS] != files[upgrade_bench.SETTINGS]


def _project_build(monkeypatch, tmp_path, existing: str | None) -> tuple[images.ImageBuilder, list]:
    """An Images whose buildah is recorded instead of run; `existing`: the ID the content tag has (or None)."""
    calls: list = []
    imgs = images.ImageBuilder(cache=tmp_path, progress=lambda msg: None)
    monkeypatch.setattr(imgs, "image_id", lambda ref: existing)
    monkeypatch.setattr(imgs, "_buildah", lambda *args, **kw: calls.append(("buildah", *args)) or "")
    monkeypatch.setattr(imgs, "_image_ids", lambda: set())
    monkeypatch.setattr(imgs, "_keep_cache", lambda name, ids: None)

    def bud(argv):
        calls.append(("bud",))
        Path(argv[argv.index("--iidfile") + 1]).write_text("sha256:" + "b" * 64)
        return []

    monkeypatch.setattr(imgs, "_bud", bud)
    return imgs, calls


def test_a_content_tag_already_built_is_taken_without_a_build(monkeypatch, tmp_path):
    # the tag is the inputs' hash: bud would take every step from its cache, and spends ~9 s checksumming
    imgs, calls = _project_build(monkeypatch, tmp_path, existing="a" * 64)
    ref, image_id = imgs.build_project(images.OPERATOR, "sha256:" + "c" * 64)
    assert image_id == "a" * 64
    assert ("bud",) not in calls
    assert ("buildah", "tag", ref, f"{images.OPERATOR.repo}:{images.ALIAS_TAG}") in calls


def test_new_inputs_are_built(monkeypatch, tmp_path):
    imgs, calls = _project_build(monkeypatch, tmp_path, existing=None)
    _, image_id = imgs.build_project(images.OPERATOR, "sha256:" + "c" * 64)
    assert ("bud",) in calls
    assert image_id == images.normalize_id("b" * 64)
