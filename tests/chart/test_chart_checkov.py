"""checkov finds no failed check in the rendered chart, and every skipped check is justified in the docs.

checkov lives in its own virtual environment in the binary cache (tools/checkov-<CHECKOV_VERSION>, made by
hack/build-test-servers.sh through hack/chart-checkov.sh) because it pins many packages of its own; without
it the scan tests fail with how to install it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_helpers import VALUE_SETS, render_text
from chatfleet_platform.common.config import REPO_ROOT, cache_dir, read_versions
from needs import need_executable

pytestmark = pytest.mark.slow

CONFIG = REPO_ROOT / "charts" / ".checkov.yaml"
DOCS = REPO_ROOT / "docs" / "chart.md"


def checkov() -> str:
    """The checkov executable, or fail with how to install it."""
    venv = cache_dir() / "tools" / f"checkov-{read_versions()['CHECKOV_VERSION']}"
    if (venv / ".complete").exists():
        return str(venv / "bin" / "checkov")
    return need_executable("checkov", "run `make setup` (or hack/chart-checkov.sh --install-only)")


def scan(directory: Path, *args: str) -> dict:
    """checkov's JSON summary of the manifests in a directory."""
    proc = subprocess.run(
        [
            checkov(),
            "-d",
            str(directory),
            "--framework",
            "kubernetes",
            "--skip-download",
            "-o",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    report = report[0] if isinstance(report, list) else report
    return report


def test_no_failed_check_in_any_value_set(tmp_path: Path) -> None:
    for name, sets in VALUE_SETS.items():
        (tmp_path / f"{name}.yaml").write_text(render_text(sets, crds=(name == "default")))
    report = scan(tmp_path, "--config-file", str(CONFIG))
    failed = [
        f"{c['check_id']} {c['check_name']} ({c['resource']})"
        for c in report.get("results", {}).get("failed_checks", [])
    ]
    assert not failed, "checkov failed checks:\n" + "\n".join(failed)
    assert report["summary"]["passed"] > 100


def test_skipped_image_checks_pass_with_digest_values(tmp_path: Path) -> None:
    """The image checks skipped for the defaults pass once a release pins a digest (the documented way)."""
    (tmp_path / "digest.yaml").write_text(render_text(VALUE_SETS["digest"]))
    report = scan(tmp_path, "--check", "CKV_K8S_43,CKV_K8S_15")
    assert report["summary"]["failed"] == 0, report["results"]["failed_checks"]
    assert report["summary"]["passed"] >= 2


def test_every_skipped_check_is_justified_in_the_docs() -> None:
    skips = yaml.safe_load(CONFIG.read_text())["skip-check"]
    docs = DOCS.read_text()
    for check in skips:
        assert check in docs, f"{check} is skipped in charts/.checkov.yaml but not justified in docs/chart.md"
