"""spec.runtime.precision auto (the default) and spec.runtime.calibration, through a real kube-apiserver.

Test design: each manifest goes through `kubectl apply --dry-run=server -o json`: accepted ones are read
back with the API server's defaults filled in, refused ones must carry the rule's message naming the field.
"""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = pytest.mark.cluster


def bot(runtime: dict | None = None) -> dict:
    """A minimal ChatbotService with the given spec.runtime."""
    spec: dict = {"model": {"uri": "hf://org/model"}}
    if runtime is not None:
        spec["runtime"] = runtime
    return {
        "apiVersion": "chatfleet.io/v1alpha1",
        "kind": "ChatbotService",
        "metadata": {"name": "precise-bot"},
        "spec": spec,
    }


def dry_run(cluster, manifest: dict):
    """The server's dry-run answer (returncode, stdout + stderr)."""
    result = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        "default",
        "-o",
        "json",
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def test_precision_defaults_to_auto(crd_installed):
    rc, out = dry_run(crd_installed, bot())
    assert rc == 0, out
    runtime = json.loads(out)["spec"]["runtime"]
    assert runtime["precision"] == "auto" and "calibration" not in runtime


def test_int8_calibration_defaults_key_and_agreement(crd_installed):
    rc, out = dry_run(
        crd_installed, bot({"precision": "int8", "calibration": {"configMapRef": {"name": "cal"}}})
    )
    assert rc == 0, out
    cal = json.loads(out)["spec"]["runtime"]["calibration"]
    assert cal == {"configMapRef": {"name": "cal", "key": "prompts"}, "minAgreement": 0.98}


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        pytest.param(
            {"precision": "fp16", "calibration": {"prompts": ["hi"]}},
            "spec.runtime.calibration applies only to spec.runtime.precision int8",
            id="calibration-without-int8",
        ),
        pytest.param(
            {"calibration": {"minAgreement": 0.9}},
            "spec.runtime.calibration applies only to spec.runtime.precision int8",
            id="calibration-with-auto",
        ),
        pytest.param(
            {"precision": "int8", "calibration": {"prompts": ["hi"], "configMapRef": {"name": "cal"}}},
            "spec.runtime.calibration: set prompts or configMapRef, not both",
            id="prompts-and-configmap",
        ),
        pytest.param(
            {"precision": "int8", "calibration": {"minAgreement": 1.01}},
            "spec.runtime.calibration.minAgreement",
            id="agreement-over-1",
        ),
        pytest.param(
            {"precision": "int8", "calibration": {"prompts": ["x" * 2049]}},
            "spec.runtime.calibration.prompts[0]",
            id="prompt-too-long",
        ),
        pytest.param(
            {"precision": "int8", "calibration": {"prompts": [f"p{i}" for i in range(65)]}},
            "spec.runtime.calibration.prompts",
            id="too-many-prompts",
        ),
        pytest.param(
            {"precision": "int8", "calibration": {"prompts": []}},
            "spec.runtime.calibration.prompts",
            id="no-prompts",
        ),
        pytest.param({"precision": "fp8"}, "spec.runtime.precision", id="unknown-precision"),
    ],
)
def test_bad_precision_specs_are_refused(crd_installed, runtime, message):
    rc, out = dry_run(crd_installed, bot(runtime))
    assert rc != 0, f"accepted: {runtime}"
    assert message in out, out
