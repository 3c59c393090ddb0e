"""Cluster facts and the diagnosis of unsatisfiable specs (no node, too many GPUs, secrets, pods)."""

from __future__ import annotations

import copy

import pytest
from chatfleet_operator.api import Reason
from chatfleet_operator.converge.diagnose import NodeCatalog, crashlooping, diagnose
from chatfleet_operator.converge.facts import (
    DeploymentFacts,
    NodeFacts,
    deployment_facts,
    deployment_progress_only,
    deployment_signature,
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


class TestDeploymentSignature:
    """A Deployment's change signature: its spec through metadata.generation, its metadata, its counts."""

    BODY = {
        "metadata": {"name": "bot", "generation": 3, "labels": {"a": "1"}, "annotations": {}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "triton", "image": "i:1"}]}}},
        "status": {"observedGeneration": 3, "replicas": 2, "readyReplicas": 2, "availableReplicas": 2},
    }

    def changed(self, edit) -> dict:
        body = copy.deepcopy(self.BODY)
        edit(body)
        return body

    def test_the_spec_counts_through_its_generation(self):
        def new_image(b):
            b["spec"]["template"]["spec"]["containers"][0]["image"] = "i:2"

        same_generation = self.changed(new_image)  # not a state the API server shows
        bumped = self.changed(lambda b: (new_image(b), b["metadata"].update(generation=4)))
        assert deployment_signature(same_generation) == deployment_signature(self.BODY)
        assert deployment_signature(bumped) != deployment_signature(self.BODY)

    def test_without_a_generation_the_spec_is_hashed(self):
        def drop_generation(b):
            b["metadata"].pop("generation")

        plain = self.changed(drop_generation)
        edited = self.changed(lambda b: (drop_generation(b), b["spec"]["template"].update(x=1)))
        assert deployment_signature(edited) != deployment_signature(plain)

    @pytest.mark.parametrize(
        "edit",
        [
            pytest.param(lambda b: b["metadata"]["labels"].update(a="2"), id="a-label"),
            pytest.param(lambda b: b["metadata"]["annotations"].update(x="y"), id="an-annotation"),
            pytest.param(lambda b: b["status"].update(readyReplicas=1), id="a-count"),
        ],
    )
    def test_metadata_and_counts_count(self, edit):
        assert deployment_signature(self.changed(edit)) != deployment_signature(self.BODY)

    def test_status_bookkeeping_does_not(self):
        body = self.changed(
            lambda b: b["status"].update(conditions=[{"type": "Available", "status": "True"}])
        )
        assert deployment_signature(body) == deployment_signature(self.BODY)


class TestDeploymentProgressOnly:
    """Which Deployment changes are only rollout progress short of the replicas asked."""

    def sig(self, updated=0, ready=0, desired=2, generation=1, labels=None, deadline=False, failure=None):
        conditions = [{"type": "ReplicaFailure", "status": failure}] if failure else []
        if deadline:
            conditions.append({"type": "Progressing", "reason": "ProgressDeadlineExceeded"})
        return deployment_signature(
            {
                "metadata": {"name": "bot", "generation": generation, "labels": labels or {}},
                "spec": {"replicas": desired},
                "status": {
                    "observedGeneration": generation,
                    "replicas": max(updated, ready),
                    "updatedReplicas": updated,
                    "readyReplicas": ready,
                    "availableReplicas": ready,
                    "conditions": conditions,
                },
            }
        )

    def test_counts_short_of_the_goal_are_progress(self):
        assert deployment_progress_only(self.sig(), self.sig(updated=1))
        assert deployment_progress_only(self.sig(updated=2), self.sig(updated=2, ready=1))

    @pytest.mark.parametrize(
        "after",
        [
            pytest.param({"updated": 2, "ready": 2}, id="ready-reached"),
            pytest.param({"updated": 1, "generation": 2}, id="a-new-generation"),
            pytest.param({"updated": 1, "labels": {"x": "y"}}, id="a-label"),
            pytest.param({"updated": 1, "failure": "True"}, id="replica-failure"),
            pytest.param({"updated": 1, "deadline": True}, id="deadline-exceeded"),
            pytest.param({"desired": 3}, id="replicas-asked"),
        ],
    )
    def test_anything_else_is_not(self, after):
        assert not deployment_progress_only(self.sig(), self.sig(**after))

    def test_a_first_sight_is_not(self):
        assert not deployment_progress_only(None, self.sig(updated=1))

    def test_a_scale_down_with_enough_pods_available_is_not(self):
        assert not deployment_progress_only(self.sig(ready=3, desired=1), self.sig(ready=2, desired=1))


def test_the_deployment_controllers_revision_annotation_is_not_the_owners_change():
    """The Deployment controller annotates every new Deployment with its revision: no pass for that."""
    body = TestDeploymentSignature.BODY
    annotated = copy.deepcopy(body)
    annotated["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
    assert deployment_signature(annotated) == deployment_signature(body)


class CountedLabels(dict):
    """A node's labels that count how often placement reads them."""

    reads = 0

    def get(self, key, default=None):
        CountedLabels.reads += 1
        return super().get(key, default)


class TestNodeCatalog:
    """A pass's placement asks the nodes' catalog, which scans the nodes once per selector, not once per
    pass: with 1,600 nodes the scan took about a millisecond of every pass."""

    def catalog(self, n: int = 1600) -> NodeCatalog:
        return NodeCatalog(
            NodeFacts(f"gpu-{i}", CountedLabels({"nvidia.com/gpu.product": H100}), 8) for i in range(n)
        )

    def test_a_second_pass_with_the_same_selector_reads_no_node(self):
        catalog = self.catalog()
        CountedLabels.reads = 0
        assert diagnose(spec(gpuProduct=H100), catalog, [], None) == []
        assert CountedLabels.reads == 1600
        assert diagnose(spec(gpuProduct=H100, gpusPerReplica=16), catalog, [], None)[0].reason == (
            Reason.INSUFFICIENT_GPUS
        )
        assert diagnose(spec(gpuProduct=H100), catalog, [], None) == []
        assert CountedLabels.reads == 1600  # the same selector: the catalog's answer

    def test_a_selector_no_node_matches_is_answered_once_too(self):
        catalog = self.catalog(10)
        CountedLabels.reads = 0
        (problem,) = diagnose(spec(gpuProduct="NVIDIA-L4"), catalog, [], None)
        assert problem.reason == Reason.NO_MATCHING_GPU_NODES and H100 in problem.message
        first = CountedLabels.reads  # the match, and the products the message names
        for _ in range(2):
            assert diagnose(spec(gpuProduct="NVIDIA-L4"), catalog, [], None) == [problem]
        assert CountedLabels.reads == first

    def test_the_watch_cache_builds_a_new_catalog_when_a_nodes_facts_change_not_on_a_heartbeat(self):
        from chatfleet_operator.cache import World

        def node(product: str, gpus: int, heartbeat: str = "t0") -> dict:
            return {
                "metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.product": product}},
                "status": {
                    "allocatable": {"nvidia.com/gpu": str(gpus)},
                    "conditions": [{"lastHeartbeatTime": heartbeat}],
                },
            }

        world = World()
        index: dict = {"nodes": []}
        world.indexes = {"node_index": index}

        def seen(body: dict) -> None:  # kopf indexes the event, then the handler observes it
            index["nodes"] = [node_facts(body)]
            world.changed("Node", body)

        seen(node(H100, 8))
        first = world.snapshot(("ns", "bot")).nodes
        assert [n.allocatable_gpus for n in first] == [8]
        seen(node(H100, 8, heartbeat="t1"))
        assert world.snapshot(("ns", "bot")).nodes is first  # a heartbeat: the same catalog
        seen(node(H100, 4))
        assert [n.allocatable_gpus for n in world.snapshot(("ns", "bot")).nodes] == [4]
