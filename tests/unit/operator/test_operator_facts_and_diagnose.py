"""Cluster facts and the diagnosis of unsatisfiable specs (no node, too many GPUs, secrets, pods)."""

from __future__ import annotations

import pytest
from chatfleet_operator.api import Reason
from chatfleet_operator.converge.diagnose import crashlooping, diagnose
from chatfleet_operator.converge.facts import (
    DeploymentFacts,
    NodeFacts,
    deployment_facts,
    node_facts,
    pod_facts,
)
from chatfleet_operator.spec import ChatbotServiceSpec

H100 = "NVIDIA-H100-80GB-HBM3"
NODES = [
    NodeFacts("gpu-node-0", {"nvidia.com/gpu.product": H100}, 8),
    NodeFacts("gpu-node-3", {"nvidia.com/gpu.product": "NVIDIA-L4"}, 4),
]


#: A spec naming two Secrets the pods need: the Redis URL and the model credentials.
SECRET_SPEC = ChatbotServiceSpec.from_dict(
    {
        "model": {"uri": "hf://a/b", "credentialsSecret": "hub"},
        "runtime": {"sessions": {"redis": {"secretName": "redis"}}},
    }
)


def config_error(message: str) -> dict:
    """A pod status whose container waits in CreateContainerConfigError with the kubelet's message."""
    return {
        "containerStatuses": [
            {"state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}}}
        ]
    }


def spec(**resources) -> ChatbotServiceSpec:
    """Spec with the given resources."""
    return ChatbotServiceSpec.from_dict({"model": {"uri": "hf://a/b"}, "resources": resources})


class TestNodeFacts:
    def test_reads_gpu_labels_and_allocatable(self):
        facts = node_facts(
            {
                "metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "X"}},
                "status": {"allocatable": {"nvidia.com/gpu": "8"}},
            }
        )
        assert (facts.gpu_product, facts.allocatable_gpus, facts.schedulable) == ("X", 8, True)


class TestPodFacts:
    @pytest.mark.parametrize(
        ("status", "field", "value"),
        [
            pytest.param(
                {
                    "conditions": [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}
                    ]
                },
                "unschedulable_message",
                "m",
                id="unschedulable",
            ),
            pytest.param(
                {
                    "containerStatuses": [
                        {"restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
                    ]
                },
                "waiting_reason",
                "CrashLoopBackOff",
                id="crashloop",
            ),
            pytest.param({"conditions": [{"type": "Ready", "status": "True"}]}, "ready", True, id="ready"),
        ],
    )
    def test_fields(self, status, field, value):
        assert getattr(pod_facts({"metadata": {"name": "p"}, "status": status}), field) == value


class TestDeploymentFacts:
    @pytest.mark.parametrize(
        ("status", "rolled_out"),
        [
            pytest.param(
                {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2},
                True,
                id="done",
            ),
            pytest.param(
                {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2},
                False,
                id="old-generation",
            ),
            pytest.param(
                {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2},
                False,
                id="old-pods-left",
            ),
            pytest.param(
                {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 1},
                False,
                id="not-available",
            ),
        ],
    )
    def test_rolled_out(self, status, rolled_out):
        body = {"metadata": {"name": "d", "generation": 2}, "spec": {"replicas": 2}, "status": status}
        assert deployment_facts(body).rolled_out is rolled_out


class TestDiagnose:
    @pytest.mark.parametrize(
        ("resources", "reasons"),
        [
            pytest.param({"gpuProduct": H100}, [], id="fits"),
            pytest.param({"gpuProduct": "NVIDIA-B200"}, [Reason.NO_MATCHING_GPU_NODES], id="unknown-product"),
            pytest.param(
                {"gpuProduct": "NVIDIA-L4", "gpusPerReplica": 8},
                [Reason.INSUFFICIENT_GPUS],
                id="too-many-gpus",
            ),
            pytest.param({"gpusPerReplica": 16}, [Reason.INSUFFICIENT_GPUS], id="more-than-any-node"),
            pytest.param(
                {"nodeSelector": {"zone": "moon"}}, [Reason.NO_MATCHING_GPU_NODES], id="node-selector"
            ),
        ],
    )
    def test_placement(self, resources, reasons):
        assert [p.reason for p in diagnose(spec(**resources), NODES, [], None)] == reasons

    def test_messages_name_the_field(self):
        (problem,) = diagnose(spec(gpuProduct="NVIDIA-B200"), NODES, [], None)
        assert "spec.resources.gpuProduct" in problem.message and "NVIDIA-L4" in problem.message

    def test_no_pod_no_secret_problem(self):
        """The operator reads no Secret: before a pod reports one missing, nothing is known."""
        assert diagnose(SECRET_SPEC, NODES, [], None) == []

    @pytest.mark.parametrize(
        ("message", "reason", "names"),
        [
            pytest.param(
                'secret "redis" not found',
                Reason.SECRET_NOT_FOUND,
                ["Secret 'redis'", "spec.runtime.sessions.redis.secretName", "does not exist", "pod p-1"],
                id="redis-secret",
            ),
            pytest.param(
                'secret "hub" not found',
                Reason.SECRET_NOT_FOUND,
                ["Secret 'hub'", "spec.model.credentialsSecret", "does not exist"],
                id="credentials-secret",
            ),
            pytest.param(
                "couldn't find key url in Secret team-a/redis",
                Reason.SECRET_KEY_NOT_FOUND,
                [
                    "Secret 'redis'",
                    "spec.runtime.sessions.redis.secretName",
                    "spec.runtime.sessions.redis.key",
                    "no key 'url'",
                ],
                id="redis-key",
            ),
        ],
    )
    def test_missing_secret_from_the_pod_status(self, message, reason, names):
        """A pod waiting in CreateContainerConfigError names the Secret; the problem names the spec field."""
        pod = pod_facts({"metadata": {"name": "p-1"}, "status": config_error(message)})
        (problem,) = diagnose(SECRET_SPEC, NODES, [pod], None)
        assert problem.reason == reason
        for part in names:
            assert part in problem.message

    def test_missing_secret_reported_once_for_many_pods(self):
        pods = [
            pod_facts({"metadata": {"name": n}, "status": config_error('secret "redis" not found')})
            for n in ("p-2", "p-1")
        ]
        (problem,) = diagnose(SECRET_SPEC, NODES, pods, None)
        assert problem.message.endswith("(pod p-1)")

    def test_other_config_errors_stay_config_errors(self):
        pod = pod_facts({"metadata": {"name": "p"}, "status": config_error('configmap "x" not found')})
        (problem,) = diagnose(SECRET_SPEC, NODES, [pod], None)
        assert problem.reason == Reason.CREATE_CONTAINER_CONFIG_ERROR

    def test_image_pull_names_the_pull_secrets(self):
        """A missing imagePullSecret shows as an image pull failure; the message points at the field."""
        s = ChatbotServiceSpec.from_dict(
            {"model": {"uri": "hf://a/b"}, "runtime": {"imagePullSecrets": ["regcred"]}}
        )
        status = {"containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull", "message": "401"}}}]}
        (problem,) = diagnose(s, NODES, [pod_facts({"metadata": {"name": "p"}, "status": status})], None)
        assert problem.reason == Reason.IMAGE_PULL_FAILED
        assert "spec.runtime.imagePullSecrets ['regcred']" in problem.message

    @pytest.mark.parametrize(
        ("pod_status", "reason"),
        [
            pytest.param(
                {
                    "containerStatuses": [
                        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}}}
                    ]
                },
                Reason.IMAGE_PULL_FAILED,
                id="image",
            ),
            pytest.param(
                {
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/4",
                        }
                    ]
                },
                Reason.UNSCHEDULABLE,
                id="unschedulable",
            ),
        ],
    )
    def test_pod_problems(self, pod_status, reason):
        pod = pod_facts({"metadata": {"name": "p"}, "status": pod_status})
        assert [p.reason for p in diagnose(spec(), NODES, [pod], None)] == [reason]

    def test_progress_deadline(self):
        dep = DeploymentFacts("d", 1, 1, 1, 1, 0, 0, 1, "r", deadline_exceeded=True)
        assert [p.reason for p in diagnose(spec(), NODES, [], dep)] == [Reason.PROGRESS_DEADLINE_EXCEEDED]

    def test_crashlooping_only_current_revision(self):
        status = {
            "containerStatuses": [{"restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
        }
        old = pod_facts(
            {"metadata": {"name": "a", "labels": {"chatfleet.io/revision": "old"}}, "status": status}
        )
        new = pod_facts(
            {"metadata": {"name": "b", "labels": {"chatfleet.io/revision": "new"}}, "status": status}
        )
        assert [p.name for p in crashlooping([old, new], "new")] == ["b"]
