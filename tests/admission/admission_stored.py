"""What the API server would store for a ChatbotService: `kubectl apply --dry-run=server -o json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def stored(cluster: Any, tmp_path: Path, spec: dict[str, Any], name: str = "bot") -> dict[str, Any]:
    """The object the real kube-apiserver returns for a ChatbotService with `spec` (defaults filled in);
    the test fails with the server's message when it refuses it."""
    body = {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": name},
        "spec": spec,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", "default", "-o", "json", "-f", str(path), check=False
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
