"""A real node's whole life on a scratch cluster: up, a GPU pod running on it, down leaving the host as it was.

Test design: a cluster of its own (one kwok node, one real node with 2 fake GPUs, only the pause image
imported) so that `down` can be checked against the host's state before `up`: links, iptables chains,
cgroups, mounts, network namespaces and processes. The layer's conftest runs this module first, before the
session's real node joins; only one cluster per host may run real nodes (and no other layer adds one, so
the layers that run beside this one never touch what it checks).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from chatfleet_platform.cluster import realnode
from chatfleet_platform.cluster.cluster import Cluster
from chatfleet_platform.common import procs
from chatfleet_platform.common.config import REPO_ROOT, PlatformError
from chatfleet_platform.servers.services import wait_until

pytestmark = [pytest.mark.harness, pytest.mark.cluster, pytest.mark.slow]


def host_snapshot() -> dict[str, object]:
    """What real nodes change on the host, as comparable sets."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    rules = set()
    for tool in ("iptables-save", "ip6tables-save"):
        out = subprocess.run([tool], capture_output=True, text=True).stdout
        rules |= {
            ln for ln in out.splitlines() if any(k in ln for k in ("KUBE-", "CNI-", realnode.GUARD_COMMENT))
        }
    cgroups = {str(p) for p in Path("/sys/fs/cgroup").glob("*/chatfleet-real-*")}
    # what a node mounts: its folder, the pods' netns, the kubelet's and containerd's host paths (not the
    # image builder's storage, whose mounts come and go on their own)
    node_paths = (
        str(realnode.NODES_ROOT),
        "/realnodes/",
        "/var/run/netns",
        "/run/netns",
        "/var/lib/kubelet",
        "/run/containerd",
    )
    mounts = {
        ln.split()[1]
        for ln in Path("/proc/mounts").read_text().splitlines()
        if any(p in ln.split()[1] for p in node_paths)
    }
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    return {
        # `ip -o link` lines read "5: cfbr0: <...>" (a veth's "master cfbr0" is not a link of its own)
        "bridges": {ln.split(": ")[1].split("@")[0] for ln in links.splitlines() if ": cfbr" in ln},
        "rules": rules,
        "cgroups": cgroups,
        "mounts": mounts,
        "blackhole": "blackhole 10.244.0.0/16" in routes,
        "owner": Path("/run/chatfleet-real-nodes.owner").exists(),
    }


def test_a_dead_clusters_traces_are_swept_before_real_nodes_start(tmp_path):
    """A run killed before its `down`, its checkout gone (a CI host kept between runs), left traces that no
    cluster folder records: claiming the host removes them by name, and nothing else."""
    # what such a run leaves: its lock naming a folder that is gone, a bridge holding a pod address, a
    # container process in a node cgroup, a kubelet-like process naming a node folder, a node folder,
    # the guard and a kube-proxy chain
    lock = Path("/run/chatfleet-real-nodes.owner")
    lock.write_text(str(tmp_path / "gone"))
    subprocess.run(["ip", "link", "add", "cfbr0", "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", "10.245.0.1/24", "dev", "cfbr0"], check=True)
    (realnode.NODES_ROOT / "deadbeef-0").mkdir(parents=True)
    cgroup = next(h for h in Path("/sys/fs/cgroup").iterdir() if (h / "cgroup.procs").exists()) / (
        "chatfleet-real-0"
    )
    cgroup.mkdir()
    container = subprocess.Popen(["sleep", "300"])
    (cgroup / "cgroup.procs").write_text(str(container.pid))
    kubelet = subprocess.Popen(
        ["sh", "-c", "sleep 301", "kubelet", f"--root-dir={realnode.NODES_ROOT}/deadbeef-0/kubelet"]
    )
    subprocess.run(["iptables", "-I", realnode.GUARD[0], "1", *realnode.GUARD[1:], "-j", "DROP"], check=True)
    subprocess.run(["iptables", "-t", "nat", "-N", "KUBE-SERVICES"], check=True)
    bystander = subprocess.Popen(["sleep", "302"])  # not ours: must survive
    try:
        Cluster(tmp_path / "next").realnodes._claim_host()
        assert container.wait(timeout=10) == -9 and kubelet.wait(timeout=10) == -9
        assert bystander.poll() is None, "the sweep killed a process that is not a real node's"
        snap = host_snapshot()
        assert not snap["bridges"] and not snap["rules"] and not snap["cgroups"], snap
        assert not realnode.NODES_ROOT.exists()
        assert lock.read_text() == str(tmp_path / "next")
        # the sweep refuses while a live cluster owns the host
        (tmp_path / "next" / "realnodes").mkdir(parents=True)
        (tmp_path / "next" / "realnodes" / "host.json").write_text(
            json.dumps({"pids": {"n/kubelet": [bystander.pid, procs.start_time(bystander.pid)]}})
        )
        with pytest.raises(PlatformError, match="still run on this host"):
            realnode.sweep_host()
    finally:
        for p in (container, kubelet, bystander):
            p.kill()
        lock.unlink(missing_ok=True)
        realnode.sweep_host()


def test_real_node_runs_a_gpu_pod_and_down_leaves_the_host_clean(tmp_path):
    realnode.sweep_host()  # traces of a dead cluster (the test above): up would sweep them, down too
    before = host_snapshot()
    c = Cluster(REPO_ROOT / ".work" / f"realnode-life-{tmp_path.name[-12:]}")
    try:
        c.up(nodes=1)
        (node,) = c.add_real_nodes(1, gpus=2, image_names=("pause",))
        n = json.loads(c.kubectl("get", "node", node.name, "-o", "json").stdout)
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "2"
        assert n["metadata"]["labels"][realnode.REAL_LABEL] == "true"
        assert {"key": realnode.REAL_LABEL, "value": "true", "effect": "NoSchedule"} in [
            {k: t[k] for k in ("key", "value", "effect")} for t in n["spec"]["taints"]
        ]
        assert n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") != "fake"
        # the node's pods weigh as a machine of their own against the host's processes
        shares = Path("/sys/fs/cgroup/cpu") / node.cgroup_root.lstrip("/") / "cpu.shares"
        assert int(shares.read_text()) == realnode.NODE_CPU_SHARES
        # a second cluster may not put real nodes on the same host
        with pytest.raises(PlatformError, match="already run on this host"):
            Cluster(tmp_path / "other").realnodes._claim_host()
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu-pod", "namespace": "default"},
            "spec": {
                "nodeSelector": {realnode.REAL_LABEL: "true"},
                "tolerations": [{"key": realnode.REAL_LABEL, "operator": "Exists"}],
                "containers": [
                    {
                        "name": "c",
                        "image": realnode.PAUSE_IMAGE,
                        "imagePullPolicy": "Never",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        }
        c.apply([pod])

        def running() -> dict | None:
            p = json.loads(c.kubectl("get", "pod", "gpu-pod", "-o", "json", check=False).stdout or "{}")
            return p if p.get("status", {}).get("phase") == "Running" else None

        p = wait_until(running, 90)
        assert p, c.kubectl("describe", "pod", "gpu-pod", check=False).stdout[-2000:]
        assert p["spec"]["nodeName"] == node.name and p["status"]["podIP"].startswith("10.245.0.")
        during = host_snapshot()
        assert during["bridges"] == before["bridges"] | {"cfbr0"} and during["cgroups"] and during["owner"]
        # the bridge keeps its own MAC while ports come and go: a port whose MAC is lower than every
        # other's joins and leaves (a bridge with no MAC of its own takes the lowest port's, and the
        # pods' ARP entries for their gateway then name a MAC nothing answers to, for up to ~30 s)
        mac = Path("/sys/class/net/cfbr0/address")
        assert mac.read_text().strip() == node.bridge_mac
        subprocess.run(
            [
                "ip",
                "link",
                "add",
                "cftest0",
                "address",
                "00:00:00:00:00:01",
                "type",
                "veth",
                "peer",
                "name",
                "cftest1",
            ],
            check=True,
        )
        try:
            subprocess.run(["ip", "link", "set", "cftest0", "master", "cfbr0", "up"], check=True)
            assert mac.read_text().strip() == node.bridge_mac, "a lower MAC's port changed the bridge's MAC"
        finally:
            subprocess.run(["ip", "link", "del", "cftest0"], check=False)
        assert mac.read_text().strip() == node.bridge_mac, "a port's leaving changed the bridge's MAC"
    finally:
        pids = [v[0] for v in c.realnodes.host_state().get("pids", {}).values()]
        c.down()
    after = host_snapshot()
    assert not node.dir.exists(), f"{node.dir} outlived down"
    assert after == before, {k: (before[k], after[k]) for k in after if after[k] != before[k]}
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], "a real-node process outlived down"
