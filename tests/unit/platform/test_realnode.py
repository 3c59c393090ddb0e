"""Real nodes, without starting one: the node plans (addresses, configs) and the fake GPU device plugin.

The device plugin is exercised over real gRPC on unix sockets: a stand-in for the kubelet's Registration
service receives its registration, then the test calls the plugin as the kubelet does (ListAndWatch,
Allocate) with the kubelet's message shapes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from chatfleet_platform.cluster import fakegpu, realnode
from chatfleet_platform.common import procs
from chatfleet_platform.common.config import PlatformError

pytestmark = pytest.mark.harness  # tests of the local platform (test infrastructure)


@pytest.mark.parametrize(
    ("index", "ip", "cidr", "bridge"),
    [
        pytest.param(0, "10.245.0.1", "10.245.0.0/24", "cfbr0", id="node-0"),
        pytest.param(3, "10.245.3.1", "10.245.3.0/24", "cfbr3", id="node-3"),
    ],
)
def test_node_addresses_stay_apart_from_kwok(index, ip, cidr, bridge, tmp_path):
    node = realnode.NodePlan(index, tmp_path, 0)
    assert (node.ip, node.pod_cidr, node.bridge) == (ip, cidr, bridge)
    assert not node.pod_cidr.startswith("10.244."), "kwok's simulated pod range"


def test_each_bridge_has_its_own_locally_administered_mac(tmp_path):
    macs = [realnode.NodePlan(i, tmp_path, 0).bridge_mac for i in range(3)]
    assert macs == ["02:63:66:62:72:00", "02:63:66:62:72:01", "02:63:66:62:72:02"]
    first = int(macs[0].split(":")[0], 16)
    assert first & 0b10 and not first & 0b1, "locally administered, unicast"


def test_every_node_has_its_gpus_and_only_the_first_runs_the_host_wide_parts(tmp_path):
    nodes = realnode.plans(tmp_path, 2, gpus=4)
    assert [n.gpus for n in nodes] == [4, 4]
    assert [n.primary for n in nodes] == [True, False]
    assert [n.labels()["nvidia.com/gpu.count"] for n in nodes] == ["4", "4"]
    assert all(n.labels()[realnode.REAL_LABEL] == "true" for n in nodes)
    assert "nvidia.com/gpu.product" not in realnode.NodePlan(1, tmp_path, 0).labels()


def test_a_further_node_runs_in_a_mount_namespace_of_its_own_with_its_own_device_plugin_folder(tmp_path):
    """The kubelet's device-plugin folder is one fixed path per host: two kubelets there would wipe each
    other's plugin sockets. A further node's containerd starts in a new mount namespace with the node's own
    folder bound over that path; its kubelet and plugin join that namespace. Node 0 keeps the host's."""
    first, second = realnode.plans(tmp_path, 2, gpus=4)
    cfg = tmp_path / "config.toml"
    assert first.containerd_argv("/usr/bin/containerd", cfg) == ["/usr/bin/containerd", "--config", str(cfg)]
    assert first.joined(["kubelet", "--v=1"], 42) == ["kubelet", "--v=1"]
    argv = second.containerd_argv("/usr/bin/containerd", cfg)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert f"mount --bind {second.device_plugins} {realnode.DEVICE_PLUGIN_DIR}" in argv[7]
    assert argv[-3:] == ["/usr/bin/containerd", "--config", str(cfg)]
    assert second.device_plugins != first.device_plugins and second.device_plugins.parent == second.dir
    assert second.joined(["kubelet", "--v=1"], 42) == [
        "nsenter",
        "--mount=/proc/42/ns/mnt",
        "--",
        "kubelet",
        "--v=1",
    ]


def test_the_namespace_wrapper_binds_the_folder_and_runs_the_command_with_its_arguments(tmp_path):
    """The shell line in containerd_argv, run with `mount` stubbed: it binds, then execs the command with
    its arguments intact (an argument with a space included)."""
    (node,) = [n for n in realnode.plans(tmp_path, 2, gpus=1) if not n.primary]
    argv = node.containerd_argv(str(tmp_path / "containerd"), tmp_path / "a b.toml")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "mount").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/mounted\n')
    (tmp_path / "containerd").write_text(f'#!/bin/sh\nprintf "%s|" "$@" > {tmp_path}/ran\n')
    for f in (bin_ / "mount", tmp_path / "containerd"):
        f.chmod(0o755)
    env = {"PATH": f"{bin_}:/usr/bin:/bin"}
    subprocess.run(argv[5:], check=True, env=env)  # the part after unshare's own options
    assert (tmp_path / "mounted").read_text().split() == [
        "--bind",
        str(node.device_plugins),
        str(realnode.DEVICE_PLUGIN_DIR),
    ]
    assert (tmp_path / "ran").read_text() == f"--config|{tmp_path / 'a b.toml'}|"


def test_too_many_nodes_is_refused(tmp_path):
    with pytest.raises(PlatformError, match="0 to 8"):
        realnode.plans(tmp_path, 9, gpus=1)


def test_kubelet_config_carries_the_gotchas_of_this_machine(tmp_path):
    cfg = realnode.NodePlan(1, tmp_path, 0).kubelet_config(tmp_path / "ca.crt")
    assert cfg["oomScoreAdj"] == 0  # CAP_SYS_RESOURCE is withheld
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["address"] == "10.245.1.1" and cfg["healthzBindAddress"] == "127.0.0.1"
    assert cfg["registerWithTaints"] == [realnode.REAL_TAINT]
    assert cfg["cgroupRoot"] == "/chatfleet-real-1"


def test_containerd_and_cni_configs_point_into_the_node_folder(tmp_path):
    node = realnode.NodePlan(0, tmp_path, 2)
    toml = node.containerd_config("/usr/sbin/runc")
    assert "restrict_oom_score_adj = true" in toml and 'BinaryName = "/usr/sbin/runc"' in toml
    assert str(node.socket) in toml and str(node.dir) in toml
    bridge = node.cni_config()["plugins"][0]
    assert bridge["bridge"] == "cfbr0" and bridge["ipam"]["ranges"][0][0]["gateway"] == "10.245.0.1"


def test_api_endpoint_slice_points_at_the_forwarder():
    slice_ = realnode.api_endpoint_slice("10.245.0.1")
    assert slice_["endpoints"][0]["addresses"] == ["10.245.0.1"]
    assert slice_["ports"][0]["port"] == realnode.API_FORWARD_PORT
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "kubernetes"


class _Kubelet:
    """The kubelet's Registration service on a unix socket: records what registers."""

    def __init__(self, folder: Path) -> None:
        self.registered: list = []
        self.event = threading.Event()
        pb = fakegpu.pb

        def register(request, context):
            self.registered.append(request)
            self.event.set()
            return pb["Empty"]()

        handler = grpc.method_handlers_generic_handler(
            "v1beta1.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    register,
                    request_deserializer=pb["RegisterRequest"].FromString,
                    response_serializer=pb["Empty"].SerializeToString,
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{folder / 'kubelet.sock'}")
        self.server.start()


def test_device_plugin_registers_lists_and_allocates_with_the_simulated_marker(tmp_path):
    kubelet = _Kubelet(tmp_path)
    plugin = fakegpu.serve_and_register(3, tmp_path, "fake.sock")
    try:
        assert kubelet.event.wait(5)
        reg = kubelet.registered[0]
        assert (reg.version, reg.resource_name, reg.endpoint) == ("v1beta1", "nvidia.com/gpu", "fake.sock")
        pb = fakegpu.pb
        with grpc.insecure_channel(f"unix://{tmp_path / 'fake.sock'}") as ch:
            stream = ch.unary_stream(
                "/v1beta1.DevicePlugin/ListAndWatch",
                request_serializer=pb["Empty"].SerializeToString,
                response_deserializer=pb["ListAndWatchResponse"].FromString,
            )(pb["Empty"](), timeout=5)
            devices = next(stream).devices
            stream.cancel()
            assert [(d.ID, d.health) for d in devices] == [(f"sim-gpu-{i}", "Healthy") for i in range(3)]
            allocate = ch.unary_unary(
                "/v1beta1.DevicePlugin/Allocate",
                request_serializer=pb["AllocateRequest"].SerializeToString,
                response_deserializer=pb["AllocateResponse"].FromString,
            )
            req = pb["AllocateRequest"]()
            req.container_requests.add(devices_ids=["sim-gpu-0", "sim-gpu-2"])
            resp = allocate(req, timeout=5).container_responses[0]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "sim-gpu-0,sim-gpu-2"
        assert resp.envs[fakegpu.SIMULATED_ENV] == "1"
    finally:
        plugin.stop(0)
        kubelet.server.stop(0)


def test_the_marker_is_the_one_the_runtime_reads():
    from chatfleet_runtime.launcher import launch

    assert fakegpu.SIMULATED_ENV == launch.SIMULATED_GPU_ENV


def test_chat_load_users_arrive_steadily_and_come_back_only_after_the_affinity_timeout():
    """Each address is a user: a new one every reuse_after/len(sources) s, an address again only after reuse_after."""
    import time

    from chatfleet_platform.load.realpods import ChatLoad

    load = ChatLoad("http://unused", sources=("a", "b"), reuse_after=0.4)
    first = load._arrive()
    assert first == "a" and load._arrive() is None, "arrivals are spaced 0.2 s apart"
    time.sleep(0.21)
    assert load._arrive() == "b"
    load._leave("a")
    load._leave("b")
    time.sleep(0.21)
    assert load._arrive() is None, "a left less than reuse_after ago: the Service may still pin it"
    time.sleep(0.25)
    assert load._arrive() == "a"


def test_demo_waits_for_the_new_release_not_the_rolled_back_one():
    from chatfleet_platform.demo.demo_release import _promoted_to_new_revision

    done = _promoted_to_new_revision()
    rolled_back = {"stableRevision": "s1", "release": {"phase": "RolledBack", "revision": "bad"}}
    assert not done(rolled_back)
    assert not done({"stableRevision": "s1", "release": {"phase": "Progressing", "revision": "good"}})
    assert done({"stableRevision": "good"})


def test_process_cpu_seconds_reads_user_and_system_time_from_proc_stat():
    from chatfleet_platform.load.realpods import process_cpu_seconds

    # a command with spaces and parentheses: the fields are counted from the last ")"
    stat = "4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 123 0 0"
    assert process_cpu_seconds(stat, ticks=100) == 3.0


class _FakeCluster:
    """What RealNodes.lose_power uses of a Cluster: its folder and kubectl (calls recorded)."""

    def __init__(self, workdir: Path, pods: list[dict]) -> None:
        self.workdir, self.pods, self.calls = workdir, pods, []

    def kubectl(self, *args: str, check: bool = True, **_: object):
        self.calls.append(args)
        out = json.dumps({"items": self.pods}) if args[:2] == ("get", "pods") else ""
        return subprocess.CompletedProcess(args, 0, out, "")


def test_a_node_losing_power_has_its_kubelet_killed_and_its_node_deleted(tmp_path, monkeypatch):
    # the cgroup root is host-wide (/chatfleet-real-0): a real node of another run must not be touched
    killed: list[str] = []
    monkeypatch.setattr(realnode, "_kill_cgroup_tree", killed.append)
    pods = [
        {"metadata": {"namespace": "shop", "name": "bot-1"}},
        {"metadata": {"namespace": "a", "name": "b"}},
    ]
    cluster = _FakeCluster(tmp_path, pods)
    nodes = realnode.RealNodes(cluster, progress=lambda _: None)
    (node,) = realnode.plans(tmp_path, 1, 8)
    kubelet = procs.start("kubelet", ["sleep", "60"], log=tmp_path / "kubelet.log")
    nodes._save({"pids": {f"{node.name}/kubelet": kubelet.to_json()}, "nodes": [node.name]})

    lost = nodes.lose_power(node)

    assert not procs.is_ours(kubelet)
    assert lost == ["shop/bot-1", "a/b"]
    assert killed == [node.cgroup_root]
    listing, delete = cluster.calls
    assert f"--field-selector=spec.nodeName={node.name}" in listing
    assert delete[:3] == ("delete", "node", node.name)


def test_a_silent_power_loss_freezes_the_pods_that_long_then_kills_them_and_thaws(tmp_path, monkeypatch):
    """A machine without power sends nothing, not even a close: the pods are frozen for `silent_seconds`,
    killed while frozen (the signal lands as they thaw), then thawed."""
    events: list[tuple] = []
    monkeypatch.setattr(realnode, "_kill_cgroup_tree", lambda root: events.append(("kill", root)))
    monkeypatch.setattr(realnode, "_set_frozen", lambda root, frozen: events.append(("frozen", root, frozen)))
    monkeypatch.setattr(realnode.time, "sleep", lambda s: events.append(("sleep", s)))
    nodes = realnode.RealNodes(_FakeCluster(tmp_path, []), progress=lambda _: None)
    (node,) = realnode.plans(tmp_path, 1, 8)
    kubelet = procs.start("kubelet", ["sleep", "60"], log=tmp_path / "kubelet.log")
    nodes._save({"pids": {f"{node.name}/kubelet": kubelet.to_json()}, "nodes": [node.name]})

    nodes.lose_power(node, silent_seconds=3)

    root = node.cgroup_root
    assert [e for e in events if e[0] != "sleep" or e[1] == 3] == [
        ("frozen", root, True), ("sleep", 3), ("kill", root), ("frozen", root, False),
    ]  # fmt: skip


def test_a_node_with_no_kubelet_running_cannot_lose_power(tmp_path):
    nodes = realnode.RealNodes(_FakeCluster(tmp_path, []), progress=lambda _: None)
    (node,) = realnode.plans(tmp_path, 1, 8)
    with pytest.raises(PlatformError, match="no kubelet"):
        nodes.lose_power(node)


def test_a_cgroup_folder_that_goes_while_the_teardown_walks_the_tree_is_passed_over(tmp_path, monkeypatch):
    """runc removes a container's cgroup as its process exits: a teardown walking the node's cgroup tree
    then finds a listed folder gone (a bench's teardown stopped on FileNotFoundError so)."""
    top = tmp_path / "chatfleet-real-0"
    for d in ("kubepods/pod-a/c1", "kubepods/pod-b/c2"):
        (top / d).mkdir(parents=True)
        (top / d / "cgroup.procs").write_text("")
    (top / "cgroup.procs").write_text("")
    gone = top / "kubepods" / "pod-b"
    real_scandir = os.scandir

    def scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and Path(path) == gone:  # listed, removed before it is read
            shutil.rmtree(gone)
        return real_scandir(path)

    monkeypatch.setattr(realnode, "_cgroup_dirs", lambda root: [top])
    monkeypatch.setattr(os, "scandir", scandir)
    realnode._kill_cgroup_tree("/chatfleet-real-0")
    assert not gone.exists() and (top / "kubepods" / "pod-a" / "c1").is_dir()
    (gone / "c2").mkdir(parents=True)
    realnode._remove_cgroup_tree("/chatfleet-real-0")  # its own walk meets the same
    assert not gone.exists()
