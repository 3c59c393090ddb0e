"""Precision in the operator: auto by default, int8 calibration rendered to the pod, and a replica that
refused to serve int8 shown as PrecisionCheckFailed with the measured agreement.

Test design: builders from spec dicts (pure); the failure goes pod status fixture -> pod_facts ->
diagnose -> compute_status -> status_events, the route a real pass takes, with the runtime's own message
(chatfleet_runtime.engine.calibration.failure_message) so the two sides cannot drift apart.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from chatfleet_contract.parameters import ModelParameters
from chatfleet_contract.tritonconfig import parse_parameters
from chatfleet_operator.api import Reason
from chatfleet_operator.builders import build_deployment, triton_config_annotations
from chatfleet_operator.builders.tritonconfig import CALIBRATION_DIR, CALIBRATION_FILE
from chatfleet_operator.converge.diagnose import PRECISION_CHECK_PREFIX, diagnose
from chatfleet_operator.converge.facts import NodeFacts, pod_facts
from chatfleet_operator.converge.status import Observation, compute_status, get_condition, status_events
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef

REF = ObjectRef("ns", "bot", "uid-1", 3)
NODES = [NodeFacts("gpu-node-0", {"nvidia.com/gpu.product": "NVIDIA-L4"}, 4)]
NOW = datetime(2026, 11, 27, 3, 0, 0, tzinfo=UTC)


def spec_of(runtime: dict | None = None) -> ChatbotServiceSpec:
    """Spec with a default model and the given spec.runtime."""
    return ChatbotServiceSpec.from_dict({"model": {"uri": "hf://org/m"}, "runtime": runtime or {}})


def params_of(spec: ChatbotServiceSpec) -> ModelParameters:
    """The model parameters the pod reads back from its config.pbtxt."""
    (text,) = triton_config_annotations(spec).values()
    return ModelParameters.from_parameters(parse_parameters(text))


def template_of(spec: ChatbotServiceSpec) -> dict:
    """The Deployment's pod spec."""
    return build_deployment(REF, spec, PodSettings(), revision="abc")["spec"]["template"]["spec"]


def triton(pod_spec: dict) -> dict:
    """The triton container."""
    return next(c for c in pod_spec["containers"] if c["name"] == "triton")


class TestBuilders:
    def test_precision_defaults_to_auto(self):
        params = params_of(spec_of())
        assert params.precision == "auto"
        assert (params.calibration_prompts, params.calibration_file) == (None, None)

    def test_inline_prompts_and_threshold_reach_the_model_parameters(self):
        prompts = ["How do I pay?", 'Say "hi"\nthen stop']
        spec = spec_of({"precision": "int8", "calibration": {"prompts": prompts, "minAgreement": 0.95}})
        params = params_of(spec)
        assert json.loads(params.calibration_prompts) == prompts
        assert params.int8_min_agreement == 0.95 and params.calibration_file is None
        assert all(v["name"] != "calibration" for v in template_of(spec)["volumes"])

    def test_config_map_is_mounted_and_its_file_named(self):
        spec = spec_of({"precision": "int8", "calibration": {"configMapRef": {"name": "cal", "key": "k"}}})
        pod = template_of(spec)
        (volume,) = [v for v in pod["volumes"] if v["name"] == "calibration"]
        assert volume["configMap"] == {
            "name": "cal",
            "items": [{"key": "k", "path": "prompts"}],
            "optional": True,
        }
        assert {"name": "calibration", "mountPath": CALIBRATION_DIR, "readOnly": True} in triton(pod)[
            "volumeMounts"
        ]
        params = params_of(spec)
        assert params.calibration_file == CALIBRATION_FILE and params.int8_min_agreement == 0.98

    def test_int8_without_calibration_uses_the_built_in_set(self):
        params = params_of(spec_of({"precision": "int8"}))
        assert params.precision == "int8" and params.int8_min_agreement == 0.98
        assert (params.calibration_prompts, params.calibration_file) == (None, None)


def failed_pod(name: str, message: str, where: str = "lastState") -> dict:
    """A pod whose triton container ended with the given termination message (then crash-looped)."""
    terminated = {"exitCode": 1, "reason": "Error", "message": message}
    state = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}}
    status = {"restartCount": 2, "name": "triton", "state": state, where: {"terminated": terminated}}
    if where == "state":
        status = {"restartCount": 0, "name": "triton", "state": {"terminated": terminated}}
    return {
        "metadata": {"name": name, "labels": {"chatfleet.io/revision": "r1"}},
        "status": {"containerStatuses": [status, {"name": "chat-api", "state": {"running": {}}}]},
    }


def runtime_message(ratio_same: int = 93) -> str:
    """The runtime's own failure message (chatfleet_runtime.engine.calibration)."""
    from chatfleet_runtime.engine.calibration import Agreement, failure_message

    return failure_message(Agreement(ratio_same, 100, 12, "built-in fallback set (12)"), 0.98)


class TestPrecisionCheckFailed:
    def test_the_operator_matches_the_runtime_words(self):
        from chatfleet_runtime.engine.calibration import FAILURE_PREFIX

        assert PRECISION_CHECK_PREFIX == FAILURE_PREFIX

    @pytest.mark.parametrize("where", ["lastState", "state"])
    def test_the_termination_message_is_read(self, where):
        facts = pod_facts(failed_pod("p-1", runtime_message(), where))
        assert facts.terminated_message == runtime_message()

    def test_condition_and_event_name_the_measured_agreement(self):
        spec = spec_of({"precision": "int8"})
        pods = [pod_facts(failed_pod(n, runtime_message())) for n in ("p-2", "p-1")]
        (problem,) = diagnose(spec, NODES, pods, None)
        assert problem.reason == Reason.PRECISION_CHECK_FAILED == "PrecisionCheckFailed"
        assert problem.message.startswith("Pod p-1: int8 agreement 0.930 < 0.980 (93/100")
        assert "spec.runtime.calibration.minAgreement 0.98" in problem.message
        observation = Observation(
            generation=1,
            revision="r1",
            desired_replicas=1,
            gpus_per_replica=1,
            endpoint="http://bot.ns.svc.cluster.local:8080",
            selector="chatfleet.io/service=bot",
            deployment=None,
            pods=pods,
            problems=[problem],
        )
        status = compute_status({}, observation, NOW)
        stalled, ready = get_condition(status, "Stalled"), get_condition(status, "Ready")
        assert (stalled["status"], stalled["reason"]) == ("True", "PrecisionCheckFailed")
        assert (ready["status"], ready["reason"]) == ("False", "PrecisionCheckFailed")
        assert "int8 agreement 0.930 < 0.980" in stalled["message"]
        events = [e for e in status_events({}, status) if e.reason == "PrecisionCheckFailed"]
        assert len(events) == 1 and events[0].type == "Warning"
        assert "int8 agreement 0.930 < 0.980" in events[0].message
        assert status_events(status, compute_status(status, observation, NOW)) == []

    def test_other_terminations_are_no_precision_problem(self):
        pod = pod_facts(failed_pod("p-1", "launch: the Triton config asks for KIND_GPU but no CUDA device"))
        assert all(p.reason != Reason.PRECISION_CHECK_FAILED for p in diagnose(spec_of(), NODES, [pod], None))
