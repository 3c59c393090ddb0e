"""Real Kubernetes nodes on this host, beside the kwok fleet: kubelet, containerd, runc and bridge CNI.

Pods scheduled onto a real node run: containerd pulls nothing (images are imported from the project's own
builds), runc starts the containers, and the bridge CNI gives them an address that this host, Prometheus
and kube-proxy reach. Everything stays on the machine: a FORWARD rule drops pod traffic to any address
outside the pod range, and kwok's fictional pod range is blackholed.

Node i (`chatfleet-real-<i>`):

    bridge cfbr<i>   its address 10.245.<i>.1 is the node IP (the kubelet refuses a loopback node IP)
    pods             10.245.<i>.0/24 (kwok's simulated pods use 10.244.0.0/16)
    containerd       Debian's, as a plain process with its own root, state and socket in the node folder
    kubelet          identity system:node:<name>; cgroups under /chatfleet-real-<i>; tainted
                     chatfleet.io/real-node=true:NoSchedule so only pods that ask for a real node land here

Some of this exists once per host, so node 0 alone runs it:

- kube-proxy: its iptables rules are host-wide.
- The API forwarder: NODE_IP:6443 to the API server on loopback, so in-cluster clients reach
  https://10.96.0.1.

Every node has its GPUs, from its own fake device plugin. The kubelet's device-plugin folder is fixed per
host (/var/lib/kubelet/device-plugins, whatever its --root-dir), so a further node's containerd starts in
a mount namespace of its own (unshare), with the node's own folder bound over that path there; its kubelet
and device plugin join that namespace (nsenter), as they would share a machine's filesystem. Node 0 stays
in the host's namespace. Only one cluster per host may run real nodes: `host.json` in the cluster
folder records what `up` changed on the host, and `down` undoes exactly that.

Gotchas met on this kind of machine, each handled below:

- The VM withholds CAP_SYS_RESOURCE: containerd gets `restrict_oom_score_adj`, the kubelet `oomScoreAdj: 0`.
- The host has hybrid cgroups v1: use runc (crun refuses the layout) and the cgroupfs driver, with
  failCgroupV1 false.
- kwok must not take over a real node: it manages only nodes annotated `kwok.x-k8s.io/node=fake`.
- The API server has no kubelet client certificate, so the kubelet allows anonymous access. Its port is
  bound to the bridge address only.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from chatfleet_platform.common import pki, procs
from chatfleet_platform.common.config import Binaries, PlatformError, read_json, require_tool, write_json

from . import nodestore
from .nodestore import NodeImages

REAL_LABEL = "chatfleet.io/real-node"
#: Pods that tolerate this taint (and select REAL_LABEL) run on a real node; nothing else lands there.
REAL_TAINT = {"key": REAL_LABEL, "value": "true", "effect": "NoSchedule"}
#: Operator flags that place the endpoint pickers of InferencePool routing on a real node.
PICKER_PLACEMENT_ARGS = (
    f"--picker-node-selector={REAL_LABEL}=true",
    f"--picker-toleration={REAL_TAINT['key']}={REAL_TAINT['value']}:{REAL_TAINT['effect']}",
)
PODS_CIDR = "10.245.0.0/16"  # all real nodes' pod ranges
KWOK_POD_CIDR = (
    "10.244.0.0/16"  # blackholed: a Service backed by a simulated pod must not leak off the machine
)
API_FORWARD_PORT = 6443
#: Addresses on node 0's bridge that stand for distinct users of this host: ClientIP session affinity
#: (replica-ratio releases pin a client to a track) spreads them over the pods as it would real users.
CLIENT_ADDRESSES = tuple(f"10.245.255.{i}" for i in range(1, 201))
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
#: The fake GPU device plugin, run as `python -m DEVICE_PLUGIN`. The sweep also knows it by the module path it
#: had before the platform's sub-packages (chatfleet_platform.fakegpu), as a killed older run left it.
DEVICE_PLUGIN = "chatfleet_platform.cluster.fakegpu"
DEVICE_PLUGIN_COMMANDS = (DEVICE_PLUGIN.encode(), b"chatfleet_platform.fakegpu")
#: The kubelet's device-plugin folder: one fixed path per host (a further node binds its own over it).
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
GUARD_COMMENT = "chatfleet-real-node"
#: Where the nodes' folders live (short, for the Unix sockets in them); removed by down.
NODES_ROOT = Path("/var/lib/chatfleet-real")
#: cpu.shares of a node's cgroup root (a host process has 1024). A real node is a machine of its own, whose
#: pods compete with nothing else; here the node's pods are one cgroup beside every process of the host
#: (this cluster's API server and operator, the tests' clients, other clusters), each of which weighed as
#: much as all the pods together: a pod's start (imports, the model's load: a burst of CPU) waited behind
#: them. With the weight of eight host processes the pods get most of the CPU when they ask for it, and
#: leave it to the host when they idle (shares divide only what is contended).
NODE_CPU_SHARES = 8192
#: The FORWARD rule (with -j DROP) that keeps pod traffic on the machine: from the pods to anything else.
GUARD = ("FORWARD", "-s", PODS_CIDR, "!", "-d", PODS_CIDR, "-m", "comment", "--comment", GUARD_COMMENT)
#: Host paths the kubelet and containerd write whatever their root says; removed on down if up made them.
HOST_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/run/containerd"),
    Path("/var/run/netns"),
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class NodePlan:
    """Names, addresses and folders of real node `index` in a cluster folder (pure: nothing is created)."""

    index: int
    root: Path
    gpus: int

    @property
    def name(self) -> str:
        return f"chatfleet-real-{self.index}"

    @property
    def dir(self) -> Path:
        """The node's folder: short and fixed per cluster, wherever the checkout is.

        containerd and the kubelet put Unix sockets in it, and a socket path must stay under 104 bytes.
        Under a long checkout path, containerd failed with "unix socket path too long".
        """
        key = hashlib.sha1(str(self.root).encode()).hexdigest()[:8]
        return NODES_ROOT / f"{key}-{self.index}"

    @property
    def bridge(self) -> str:
        return f"cfbr{self.index}"

    @property
    def bridge_mac(self) -> str:
        """The bridge's own MAC, set at creation (locally administered: 02:, then "cfbr", then the index).

        A Linux bridge whose MAC was never set takes the lowest of its ports' MACs, so it changes whenever a
        pod with the lowest veth MAC comes or goes. Every pod's ARP entry for its gateway (the node IP,
        through which all its replies to this host go) then names a MAC no port answers to, until the entry
        expires: up to ~30 s in which a pod answers nothing from the host, its probes time out and the
        Service loses it. Seen as the bad-canary test's stable pod that stopped answering right after the
        canary's pod was deleted. A set MAC never changes."""
        return f"02:63:66:62:72:{self.index:02x}"

    @property
    def ip(self) -> str:
        return f"10.245.{self.index}.1"

    @property
    def pod_cidr(self) -> str:
        return f"10.245.{self.index}.0/24"

    @property
    def cgroup_root(self) -> str:
        return f"/{self.name}"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def primary(self) -> bool:
        """Node 0 runs what exists once per host: kube-proxy, the API forwarder; it keeps the host's mount namespace."""
        return self.index == 0

    @property
    def device_plugins(self) -> Path:
        """The folder a further node's kubelet and device plugin see at DEVICE_PLUGIN_DIR (node 0 uses the host's)."""
        return self.dir / "device-plugins"

    def containerd_argv(self, containerd: str, config: Path) -> list[str]:
        """containerd's command line: node 0's in the host's mount namespace; a further node's in a mount
        namespace of its own, made as it starts, with the node's device-plugin folder bound over the host's
        (DEVICE_PLUGIN_DIR must exist). That namespace is the node's: `joined` puts its kubelet and device
        plugin in it, so they meet each other there, and containerd sees the kubelet's volume mounts."""
        argv = [containerd, "--config", str(config)]
        if self.primary:
            return argv
        bind = f'mount --bind {self.device_plugins} {DEVICE_PLUGIN_DIR} && exec "$0" "$@"'
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", bind, *argv]

    def joined(self, argv: list[str], containerd_pid: int) -> list[str]:
        """argv run in the node's mount namespace, that of its containerd (process `containerd_pid`)."""
        if self.primary:
            return argv
        return ["nsenter", f"--mount=/proc/{containerd_pid}/ns/mnt", "--", *argv]

    @property
    def kubelet_port(self) -> int:
        return 10250

    @property
    def healthz_port(self) -> int:
        return 10348 + self.index * 10

    def labels(self) -> dict[str, str]:
        """Node labels: the real-node marker, and NVIDIA's GPU feature discovery labels where GPUs exist."""
        out = {REAL_LABEL: "true", "node.kubernetes.io/instance-type": "local-real"}
        if self.gpus:
            out.update(
                {
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": "NVIDIA-L4",
                    "nvidia.com/gpu.count": str(self.gpus),
                    "nvidia.com/gpu.memory": "23034",
                }
            )
        return out

    def cni_config(self) -> dict:
        """The CNI conflist: a bridge whose gateway is the node IP, host-local addresses, portmap."""
        return {
            "cniVersion": "1.0.0",
            "name": "chatfleet-real",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.dir / "cni" / "ipam"),
                        "ranges": [[{"subnet": self.pod_cidr, "gateway": self.ip}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def containerd_config(self, runc: str) -> str:
        """containerd's config.toml: CRI on, own root/state/socket, runc, our CNI folder."""
        d = self.dir / "containerd"
        return f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # this VM withholds CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below containerd's own
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
        Root = "{d / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.dir / "cni" / "net.d"}"
    max_conf_num = 1
"""

    def kubelet_config(self, ca: Path) -> dict:
        """The KubeletConfiguration (see the module docstring for why each unusual value is there)."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "imageServiceEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": True,
            # two cores serve several pods: CPU limits are not enforced here (requests still schedule)
            "cpuCFSQuota": False,
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "podLogsDir": str(self.dir / "pod-logs"),
            "resolvConf": str(self.dir / "resolv.conf"),
            "clusterDomain": "cluster.local",
            "maxPods": 40,
            "serializeImagePulls": False,
            "registerNode": True,
            "registerWithTaints": [REAL_TAINT],
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "imageMinimumGCAge": "24h",
            "evictionHard": {
                "memory.available": "200Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "volumePluginDir": str(self.dir / "kubelet" / "volume-plugins"),
            "nodeStatusReportFrequency": "1m",
            "nodeStatusUpdateFrequency": "10s",
            "shutdownGracePeriod": "0s",
            "oomScoreAdj": 0,
        }

    def kube_proxy_config(self) -> dict:
        """kube-proxy in iptables mode, NodePorts on the bridge address only, host sysctls left alone."""
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.dir / "pki" / "kube-proxy.kubeconfig")},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": PODS_CIDR,
            "detectLocalMode": "ClusterCIDR",
            "healthzBindAddress": "127.0.0.1:10356",
            "metricsBindAddress": "127.0.0.1:10349",
            "nodePortAddresses": [f"{self.ip}/32"],
            "iptables": {
                "localhostNodePorts": False,
                "masqueradeAll": False,
                "syncPeriod": "30s",
                "minSyncPeriod": "1s",
            },
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }


def readable_by_pods(folder: Path) -> Path:
    """`folder` (a model the real node's pods mount with spec.model.hostPath) readable by the pods'
    non-root user: a hostPath mount keeps the host's modes. Returns `folder`."""
    for p in [folder, *folder.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o444 | (0o111 if p.is_dir() else 0))
    return folder


def plans(root: Path, count: int, gpus: int) -> list[NodePlan]:
    """The plans of `count` real nodes in cluster folder `root`, `gpus` GPUs each."""
    if count < 0 or count > 8:
        raise PlatformError(f"real nodes: 0 to 8 on one host, got {count}")
    return [NodePlan(i, root, gpus) for i in range(count)]


def api_endpoint_slice(ip: str) -> dict:
    """The EndpointSlice of the `kubernetes` Service: the API forwarder on node 0's address.

    The API server runs with --endpoint-reconciler-type=none (it listens on loopback), so nobody else
    writes it.
    """
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "chatfleet-platform",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": API_FORWARD_PORT, "protocol": "TCP"}],
    }


NODE_RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "chatfleet:real-nodes"},
        # RBAC only (no Node authorizer): the bootstrap role system:node for the group of node identities
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "chatfleet:kube-proxy"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:node-proxier",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-proxy"}],
    },
]


def require_host_tools() -> dict[str, str]:
    """Paths of the Debian tools a real node needs, or one PlatformError naming what is missing."""
    hint = "run `make system-deps` (Debian: containerd runc containernetworking-plugins iptables socat)"
    names = ("containerd", "ctr", "runc", "iptables", "ip", "socat", "unshare", "nsenter")
    tools = {t: require_tool(t, hint) for t in names}
    if not Path("/usr/lib/cni/bridge").exists():
        raise PlatformError(f"the CNI plugins are missing (/usr/lib/cni/bridge): {hint}")
    if os.geteuid() != 0:
        raise PlatformError("real nodes need root (bridges, iptables, cgroups); use REAL_NODES=0 otherwise")
    return tools


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:  # e.g. no modprobe: optional steps pass check=False
        res = subprocess.CompletedProcess(list(argv), 127, "", str(e))
    if check and res.returncode != 0:
        raise PlatformError(f"{' '.join(argv)} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


class RealNodes:
    """Start and stop the real nodes of one cluster; all state under `<cluster>/realnodes/`."""

    def __init__(self, cluster, progress: Progress) -> None:
        self.cluster = cluster
        self.progress = progress

    # ---- state ---------------------------------------------------------------------------------
    @property
    def folder(self) -> Path:
        return self.cluster.workdir / "realnodes"

    @property
    def host_file(self) -> Path:
        return self.folder / "host.json"

    def host_state(self) -> dict:
        """What up changed on the host and which processes it started ({} when none)."""
        return read_json(self.host_file)

    def _save(self, state: dict) -> None:
        write_json(self.host_file, state)

    def running(self) -> int:
        """How many of the recorded real nodes have a live kubelet."""
        pids = self.host_state().get("pids", {})
        return sum(
            procs.is_ours(procs.Proc.from_json(pids.get(f"{n}/kubelet")))
            for n in self.host_state().get("nodes", [])
        )

    @staticmethod
    def _lock_path() -> Path:
        return Path("/run/chatfleet-real-nodes.owner")

    # ---- up ------------------------------------------------------------------------------------
    def up(self, count: int, *, gpus: int, images: NodeImages | None) -> list[NodePlan]:
        """Start `count` real nodes with `images` (the sandbox and project images) in each node's
        containerd: a kept store of the same images (nodestore) when there is one, else imported."""
        if count == 0:
            return []
        tools = require_host_tools()
        bins: Binaries = self.cluster.binaries
        missing = bins.missing(("kubelet", "kube_proxy"))
        if missing:
            raise PlatformError(
                f"real nodes need {', '.join(missing)}: run `make platform-build` "
                "(or REAL_NODES=0 for simulated nodes only)"
            )
        self._claim_host()
        nodes = plans(self.cluster.workdir, count, gpus)
        state = self.host_state() or {"pids": {}, "created": [], "nodes": []}
        state["nodes"] = [n.name for n in nodes]
        for p in HOST_PATHS:
            if not p.exists() and str(p) not in state["created"]:
                state["created"].append(str(p))
        self._save(state)
        t0 = time.monotonic()
        self._host_network(state)
        self.cluster.apply(NODE_RBAC)
        # node 0 last: its kubelet and device plugin use the host's device-plugin folder, which a kubelet
        # wipes when it starts; the further nodes' bind their own over it in their mount namespaces
        for node in sorted(nodes, key=lambda n: n.primary):
            self._node_up(node, state, tools, bins, images)
        self.progress(f"{count} real node(s) Ready ({time.monotonic() - t0:.1f}s)")
        return nodes

    def _claim_host(self) -> None:
        lock = self._lock_path()
        if lock.exists():
            owner = Path(lock.read_text().strip())
            if owner.exists():
                other = RealNodes(type(self.cluster)(owner), self.progress)
                if any(
                    procs.is_ours(procs.Proc.from_json(v))
                    for v in other.host_state().get("pids", {}).values()
                ):
                    if owner == self.cluster.workdir:
                        return  # ours already: more nodes for a running cluster
                    raise PlatformError(
                        f"real nodes already run on this host for the cluster in {owner}: stop it first "
                        f"(`make cluster-down`, or CHATFLEET_CLUSTER_DIR={owner} python -m chatfleet_platform.cli down), "
                        "or start this one with REAL_NODES=0"
                    )
                other.down()  # a dead owner: undo what it recorded in its folder
        # What no folder records any more (an earlier run killed, its checkout gone): sweep by name
        left = sweep_host()
        if left:
            self.progress(f"swept what a dead cluster left on this host: {', '.join(left)}")
        lock.write_text(str(self.cluster.workdir))

    def _host_network(self, state: dict) -> None:
        """Forwarding on, pod traffic kept on the machine, kwok's fictional pod range blackholed."""
        if "ip_forward" not in state:
            state["ip_forward"] = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
            self._save(state)
        _run("sysctl", "-qw", "net.ipv4.ip_forward=1")
        _run("modprobe", "br_netfilter", check=False)
        _run("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", check=False)
        if _run("iptables", "-C", *GUARD, "-j", "DROP", check=False).returncode != 0:
            _run("iptables", "-I", GUARD[0], "1", *GUARD[1:], "-j", "DROP")
        _run("ip", "route", "replace", "blackhole", KWOK_POD_CIDR)

    def _start(self, state: dict, key: str, node: NodePlan, argv: list[str]) -> procs.Proc:
        proc = state["pids"].get(key)
        if procs.is_ours(procs.Proc.from_json(proc)):
            return procs.Proc.from_json(proc)
        started = procs.start(key, argv, log=node.dir / "logs" / f"{key.split('/')[-1]}.log", cwd=node.dir)
        state["pids"][key] = started.to_json()
        self._save(state)
        return started

    def _node_up(self, node: NodePlan, state: dict, tools: dict, bins: Binaries, images) -> None:
        t0 = time.monotonic()
        for sub in ("logs", "containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "pki"):
            (node.dir / sub).mkdir(parents=True, exist_ok=True)
        # 1. the bridge whose address is the node IP
        if _run("ip", "link", "show", node.bridge, check=False).returncode != 0:
            _run("ip", "link", "add", node.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{node.ip}/24", "dev", node.bridge)
        _run("ip", "link", "set", node.bridge, "address", node.bridge_mac, "up")  # new or found: its own MAC
        (node.dir / "resolv.conf").write_text("nameserver 127.0.0.1\noptions ndots:1 timeout:1 attempts:1\n")
        (node.dir / "cni" / "net.d" / "10-chatfleet.conflist").write_text(
            json.dumps(node.cni_config(), indent=1)
        )
        # 2. containerd, then the images (the sandbox image before any pod)
        reused = images is not None and nodestore.take(images.key, node.dir / "containerd" / "root")
        cfg = node.dir / "containerd" / "config.toml"
        cfg.write_text(node.containerd_config(tools["runc"]))
        if not node.primary:
            node.device_plugins.mkdir(exist_ok=True)
            DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)  # /var/lib/kubelet is in HOST_PATHS
        ctrd = self._start(
            state, f"{node.name}/containerd", node, node.containerd_argv(tools["containerd"], cfg)
        )
        procs.wait_for(
            f"{node.name} containerd",
            lambda: _run(tools["ctr"], "--address", str(node.socket), "version", check=False).returncode == 0,
            timeout=30,
            log=node.dir / "logs" / "containerd.log",
            proc=ctrd,
        )
        if images:
            self._images(node, state, tools, images, reused)
        # 3. identities: the node's and kube-proxy's client certificates
        cpki = self.cluster.workdir / "pki"
        pki.client_identity(cpki, node.name, f"system:node:{node.name}", "system:nodes")
        (node.dir / "pki" / "kubelet.kubeconfig").write_text(
            pki.kubeconfig(self.cluster.server, cpki, user=node.name)
        )
        # 4. the kubelet; its cgroup root must exist in every v1 hierarchy (the systemd one included)
        for h in Path("/sys/fs/cgroup").iterdir():
            if h.is_dir() and h.name != "unified" and not h.is_symlink():
                (h / node.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
                shares = h / node.cgroup_root.lstrip("/") / "cpu.shares"
                if shares.exists():
                    shares.write_text(str(NODE_CPU_SHARES))
        kcfg = node.dir / "kubelet" / "config.yaml"
        kcfg.write_text(yaml.safe_dump(node.kubelet_config(cpki / "ca.crt"), sort_keys=False))
        self._kubelet_up(node, state, bins)
        if node.primary:
            self._primary_extras(node, state, bins)
        if node.gpus:
            self._start(
                state,
                f"{node.name}/device-plugin",
                node,
                self._joined(node, state, [sys.executable, "-m", DEVICE_PLUGIN, "--count", str(node.gpus)]),
            )
            self._wait_for_gpus(node)
        self.progress(f"real node {node.name} Ready at {node.ip} ({time.monotonic() - t0:.1f}s)")

    def _kubelet_up(self, node: NodePlan, state: dict, bins: Binaries) -> None:
        """Start the node's kubelet (its config and identity written by _node_up) and wait until the Node is
        Ready (the kubelet registers it when the API has none)."""
        labels = ",".join(f"{k}={v}" for k, v in node.labels().items())
        kubelet = self._start(
            state,
            f"{node.name}/kubelet",
            node,
            self._joined(
                node,
                state,
                [
                    str(bins.kubelet),
                    f"--config={node.dir / 'kubelet' / 'config.yaml'}",
                    f"--kubeconfig={node.dir / 'pki' / 'kubelet.kubeconfig'}",
                    f"--root-dir={node.dir / 'kubelet'}",
                    f"--cert-dir={node.dir / 'kubelet' / 'pki'}",
                    f"--hostname-override={node.name}",
                    f"--node-ip={node.ip}",
                    f"--node-labels={labels}",
                    "--v=1",
                ],
            ),
        )
        procs.wait_for(
            f"{node.name} Ready",
            lambda: self._node_ready(node.name),
            timeout=120,
            log=node.dir / "logs" / "kubelet.log",
            proc=kubelet,
            interval=0.5,
        )

    def _joined(self, node: NodePlan, state: dict, argv: list[str]) -> list[str]:
        """argv in the node's mount namespace (NodePlan.joined), its containerd's as `state` records it."""
        return node.joined(argv, procs.Proc.from_json(state["pids"][f"{node.name}/containerd"]).pid)

    # ---- drills ----------------------------------------------------------------------------------
    def lose_power(self, node: NodePlan, *, silent_seconds: float = 0.0) -> list[str]:
        """What a GPU node losing power does to the cluster, for drills: its kubelet and every process of
        its pods SIGKILLed (no preStop, no drain, no goodbye to the API), then its Node deleted, as a
        cloud's node controller deletes the Node of a machine that is gone. With `silent_seconds`, its
        pods are first frozen that long (the cgroup freezer: no byte more, and no connection closed, as a
        machine without power sends nothing), then killed. Returns the pods (namespace/name)
        the API still had on it: the pod garbage collector deletes them after its 40 s quarantine; a drill
        may do that sooner, and must before `rejoin` (a Node of the same name would take them back).

        Host-wide parts (kube-proxy, the API forwarder) keep running, and so do the node's containerd and
        device plugin: on this host they stand for the rest of the cluster and the replacement machine. `rejoin` brings the
        node back.
        """
        state = self.host_state()
        kubelet = procs.Proc.from_json(state.get("pids", {}).get(f"{node.name}/kubelet"))
        if not procs.is_ours(kubelet):
            raise PlatformError(f"{node.name}: no kubelet of this cluster runs")
        with contextlib.suppress(ProcessLookupError):
            os.kill(kubelet.pid, signal.SIGKILL)
        procs.stop(kubelet, timeout=5)  # reaped (SIGKILL again if it were still there)
        if silent_seconds:
            _set_frozen(node.cgroup_root, True)
            time.sleep(silent_seconds)
        _kill_cgroup_tree(node.cgroup_root)  # a frozen process dies as it thaws
        if silent_seconds:
            _set_frozen(node.cgroup_root, False)
        listed = self.cluster.kubectl(
            "get", "pods", "-A", f"--field-selector=spec.nodeName={node.name}", "-o", "json", check=False
        )
        items = json.loads(listed.stdout or "{}").get("items") or []
        on_node = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in items]
        self.cluster.kubectl("delete", "node", node.name, "--wait=false", check=False)
        self.progress(f"{node.name} lost power: kubelet and {len(on_node)} pod(s) killed, its Node deleted")
        return on_node

    def rejoin(self, node: NodePlan) -> None:
        """The node back after `lose_power` (a replacement machine of the same name): its kubelet started
        again registers the Node afresh and cleans up the dead pods' sandboxes; the device plugin registers
        again when the kubelet wipes its socket folder. Returns once the Node is Ready and, on a GPU node,
        advertises its GPUs again."""
        t0 = time.monotonic()
        state = self.host_state()
        self._kubelet_up(node, state, self.cluster.binaries)
        if node.gpus:
            self._wait_for_gpus(node)
        self.progress(f"{node.name} rejoined, Ready ({time.monotonic() - t0:.1f}s)")

    def _images(self, node: NodePlan, state: dict, tools: dict, images: NodeImages, reused: bool) -> None:
        """Import the images the containerd does not list (all of them unless the kept store was put
        back), drop the older versions a kept store holds, and record the store's key for down."""
        ctr = [tools["ctr"], "--address", str(node.socket), "-n", "k8s.io", "images"]
        listing = _run(*ctr, "ls").stdout if reused else ""
        missing = images.missing(listing)
        if reused:
            kept = sorted(set(images.refs) - set(missing))
            self.progress(f"{node.name}: from the kept store: {', '.join(kept) or 'no image'}")
        if missing:
            images.load(node.socket, missing)
        if reused:
            stale = images.stale(_run(*ctr, "ls").stdout)
            if stale:
                _run(*ctr, "rm", *stale)
                self.progress(f"{node.name}: removed {len(stale)} older image reference(s)")
        state.setdefault("image_keys", {})[node.name] = images.key
        self._save(state)

    def _primary_extras(self, node: NodePlan, state: dict, bins: Binaries) -> None:
        """kube-proxy and the API forwarder (once per host, on node 0)."""
        cpki = self.cluster.workdir / "pki"
        pki.client_identity(cpki, "kube-proxy", "system:kube-proxy")
        (node.dir / "pki" / "kube-proxy.kubeconfig").write_text(
            pki.kubeconfig(self.cluster.server, cpki, user="kube-proxy")
        )
        pcfg = node.dir / "kube-proxy.yaml"
        pcfg.write_text(yaml.safe_dump(node.kube_proxy_config(), sort_keys=False))
        proxy = self._start(
            state, f"{node.name}/kube-proxy", node, [str(bins.kube_proxy), f"--config={pcfg}", "--v=1"]
        )
        procs.wait_for(
            "kube-proxy",
            lambda: procs.http_ok("http://127.0.0.1:10356/healthz"),
            timeout=60,
            log=node.dir / "logs" / "kube-proxy.log",
            proc=proxy,
        )
        api_port = self.cluster.state()["ports"]["apiserver"]
        self._start(
            state,
            f"{node.name}/api-forward",
            node,
            [
                "socat",
                f"TCP-LISTEN:{API_FORWARD_PORT},bind={node.ip},reuseaddr,fork",
                f"TCP:127.0.0.1:{api_port}",
            ],
        )
        self.cluster.apply([api_endpoint_slice(node.ip)])
        for addr in CLIENT_ADDRESSES:  # inside the pods' /16 (no masquerade), outside every node's /24
            _run("ip", "addr", "replace", f"{addr}/32", "dev", node.bridge)

    def _wait_for_gpus(self, node: NodePlan) -> None:
        """Until the Node's allocatable holds its GPUs (the device plugin has registered with the kubelet)."""
        procs.wait_for(
            f"{node.name} advertising {node.gpus} nvidia.com/gpu",
            lambda: self._allocatable_gpus(node.name) == node.gpus,
            timeout=60,
            log=node.dir / "logs" / "device-plugin.log",
            interval=0.5,
        )

    def _node_status(self, name: str) -> dict:
        """The Node's status ({} while it is not registered); a plain read (no kubectl process)."""
        res = self.cluster.kubectl("get", "node", name, "-o", "json", "--ignore-not-found", check=False)
        if res.returncode != 0 or not res.stdout.strip():
            return {}
        return json.loads(res.stdout).get("status") or {}

    def _node_ready(self, name: str) -> bool:
        conditions = self._node_status(name).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _allocatable_gpus(self, name: str) -> int:
        return int((self._node_status(name).get("allocatable") or {}).get("nvidia.com/gpu") or 0)

    # ---- down ----------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop what up started and undo its host changes, in an order that leaves nothing behind."""
        state = self.host_state()
        if not state:
            return []
        stopped: list[str] = []
        names = state.get("nodes", [])
        count = len(names)
        nodes = plans(self.cluster.workdir, count, 0)
        # 1. let the kubelets tear their pods down (CNI DEL, unmounts) while the API is there
        if names and self.cluster.workdir.exists():
            try:
                for n in names:
                    self.cluster.kubectl(
                        "delete", "pods", "-A", f"--field-selector=spec.nodeName={n}",
                        "--grace-period=1", "--wait=true", "--timeout=40s", check=False, timeout=60,
                    )  # fmt: skip
                self.cluster.kubectl("delete", "nodes", *names, "--wait=false", check=False, timeout=30)
            except Exception:  # the API may be gone already: the steps below still clean up
                pass
        pids = state.get("pids", {})

        def stop(key: str) -> None:
            proc = procs.Proc.from_json(pids.get(key))
            if procs.stop(proc):
                stopped.append(key)
                self.progress(f"stopped {key} (pid {proc.pid})")

        for n in nodes:
            for part in ("api-forward", "device-plugin", "kube-proxy"):
                stop(f"{n.name}/{part}")
        kube_proxy = self.cluster.binaries.kube_proxy if count else None
        if kube_proxy and kube_proxy.exists() and any(k.endswith("/kube-proxy") for k in pids):
            subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True, timeout=60)
        for n in nodes:
            stop(f"{n.name}/kubelet")
        # 2. whatever containers are left: kill every process in our cgroups, then containerd and its shims
        for n in nodes:
            _kill_cgroup_tree(n.cgroup_root)
        keys = state.get("image_keys", {})
        for n in nodes:
            if n.name in keys:  # a store to keep holds images only: the pods' containers go
                keys[n.name] = keys[n.name] if _remove_containers(n.socket) else None
        for n in nodes:
            stop(f"{n.name}/containerd")
            _kill_shims(n.socket)
        time.sleep(0.5)
        for n in nodes:
            _kill_cgroup_tree(n.cgroup_root)
            _remove_cgroup_tree(n.cgroup_root)
        # 3. mounts under the folders (overlay snapshots, shm, pod volumes), our pods' network namespaces
        _unmount_under(self.folder)
        for n in nodes:
            _unmount_under(n.dir)
        _remove_netns_in(PODS_CIDR)
        for n in nodes:
            if keys.get(n.name) and nodestore.keep(keys[n.name], n.dir / "containerd" / "root"):
                self.progress(f"kept {n.name}'s images for the next run ({keys[n.name]})")
            shutil.rmtree(n.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            NODES_ROOT.rmdir()  # only when no other cluster's node folder is left
        # 4. network: bridges, the guard, CNI's and the kubelet's iptables chains, the blackhole route
        for n in nodes:
            _run("ip", "link", "del", n.bridge, check=False)
        while _run("iptables", "-D", *GUARD, "-j", "DROP", check=False).returncode == 0:
            pass
        _remove_chains("CNI-", "KUBE-")
        _run("ip", "route", "del", "blackhole", KWOK_POD_CIDR, check=False)
        if "ip_forward" in state:
            _run("sysctl", "-qw", f"net.ipv4.ip_forward={state['ip_forward']}", check=False)
        # 5. host folders the kubelet and containerd wrote outside their roots, if up made them
        for p in map(Path, state.get("created", [])):
            if p.exists():
                _unmount_under(p)
                shutil.rmtree(p, ignore_errors=True)
        lock = self._lock_path()
        if lock.exists() and lock.read_text().strip() == str(self.cluster.workdir):
            lock.unlink()
        self.host_file.unlink(missing_ok=True)
        return stopped


def host_owner() -> Path | None:
    """The cluster folder that holds this host's real nodes, if its processes still run."""
    lock = RealNodes._lock_path()
    if not lock.exists():
        return None
    owner = Path(lock.read_text().strip())
    state = read_json(owner / "realnodes" / "host.json") if owner.exists() else {}
    alive = any(procs.is_ours(procs.Proc.from_json(v)) for v in (state or {}).get("pids", {}).values())
    return owner if alive else None


def sweep_host() -> list[str]:
    """Remove, by name, every real-node trace on this host whose cluster is gone; return what it found.

    `down` undoes what a cluster's folder records. A run killed before its `down`, whose checkout is gone
    too (a CI machine that keeps its host between runs), leaves processes, pods, a bridge whose addresses
    the next cluster's pods would get again, cgroups, mounts and iptables rules that no folder records.
    They are found by the names this module gives them. Refuses while a live cluster owns the host.
    """
    owner = host_owner()
    if owner is not None:
        raise PlatformError(f"real nodes of the cluster in {owner} still run on this host: stop it first")
    found: list[str] = []
    root = f"{NODES_ROOT}/".encode()
    for proc in Path("/proc").iterdir():  # kubelets, containerds, shims, kube-proxy, forwarder, plugin
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        forwarder = cmd.startswith(b"socat\0") and b"bind=10.245." in cmd
        if root in cmd or forwarder or any(plugin in cmd for plugin in DEVICE_PLUGIN_COMMANDS):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                found.append(f"process {proc.name}")
    groups = sorted({d.name for h in Path("/sys/fs/cgroup").iterdir() for d in h.glob("chatfleet-real-*")})
    for g in groups:
        _kill_cgroup_tree(f"/{g}")
    if groups:
        time.sleep(0.5)
    for g in groups:
        _kill_cgroup_tree(f"/{g}")
        _remove_cgroup_tree(f"/{g}")
        found.append(f"cgroup {g}")
    if NODES_ROOT.exists():
        _unmount_under(NODES_ROOT)
        _unmount_under(Path("/var/lib/kubelet/pods"))
        _remove_netns_in(PODS_CIDR)
        shutil.rmtree(NODES_ROOT, ignore_errors=True)
        found.append(str(NODES_ROOT))
    links = _run("ip", "-o", "link", check=False).stdout.splitlines()
    for bridge in sorted({ln.split(": ")[1].split("@")[0] for ln in links if ": cfbr" in ln}):
        _run("ip", "link", "del", bridge, check=False)
        found.append(f"bridge {bridge}")
    while _run("iptables", "-D", *GUARD, "-j", "DROP", check=False).returncode == 0:
        found.append("guard rule")
    chains = [
        ln.split()[0][1:]
        for tool in ("iptables-save", "ip6tables-save")
        for ln in _run(tool, check=False).stdout.splitlines()
        if ln.startswith((":KUBE-", ":CNI-"))
    ]
    if chains:
        _remove_chains("CNI-", "KUBE-")
        found.append(f"{len(chains)} iptables chains")
    if _run("ip", "route", "del", "blackhole", KWOK_POD_CIDR, check=False).returncode == 0:
        found.append("blackhole route")
    return found


def _cgroup_dirs(root: str) -> list[Path]:
    return [h / root.lstrip("/") for h in Path("/sys/fs/cgroup").iterdir() if (h / root.lstrip("/")).is_dir()]


def _tree(top: Path) -> list[Path]:
    """`top` and every folder under it, parents first. Folders that go while it walks (a container's cgroup
    removed by runc as its process exits) are passed over: `Path.rglob` raises FileNotFoundError there,
    which broke a teardown between two pods' exits."""
    return [Path(folder) for folder, _, _ in os.walk(top)]


def _kill_cgroup_tree(root: str) -> None:
    """SIGKILL every process in the cgroup tree `root` (containers left after the kubelet stopped)."""
    for top in _cgroup_dirs(root):
        for procs_file in (d / "cgroup.procs" for d in _tree(top)):
            try:
                pids = procs_file.read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


def _set_frozen(root: str, frozen: bool) -> None:
    """Freeze (or thaw) every process in the cgroup tree `root` (cgroup v1's freezer: a parent's state is
    its descendants')."""
    (Path("/sys/fs/cgroup/freezer") / root.lstrip("/") / "freezer.state").write_text(
        "FROZEN" if frozen else "THAWED"
    )


def _remove_cgroup_tree(root: str) -> None:
    """Remove the (empty) cgroup folders of `root`, deepest first, in every hierarchy."""
    for top in _cgroup_dirs(root):
        for d in sorted(_tree(top)[1:], key=lambda p: len(p.parts), reverse=True):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError:
            pass


def _remove_containers(socket: Path) -> bool:
    """Delete every task and container in the containerd at socket (Kubernetes' namespace), leaving its
    images; True when none is left. Their snapshots go at containerd's next garbage collection."""
    ctr = shutil.which("ctr")
    if ctr is None or not socket.exists():
        return False
    base = [ctr, "--address", str(socket), "-n", "k8s.io"]
    listed = _run(*base, "containers", "ls", "-q", check=False)
    if listed.returncode != 0:
        return False
    for cid in listed.stdout.split():
        _run(*base, "tasks", "rm", "-f", cid, check=False)
        _run(*base, "containers", "rm", cid, check=False)
    left = _run(*base, "containers", "ls", "-q", check=False)
    return left.returncode == 0 and not left.stdout.split()


def _kill_shims(socket: Path) -> None:
    """Kill the containerd shims that name our containerd's socket (and only those)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and str(socket).encode() in cmd:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _unmount_under(folder: Path) -> None:
    """Lazily unmount every mount point under folder, deepest first."""
    prefix = str(folder.resolve())
    try:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return
    mine = sorted({m for m in mounts if m == prefix or m.startswith(prefix + "/")}, key=len, reverse=True)
    for m in mine:
        subprocess.run(["umount", "-l", m], capture_output=True)


def _remove_netns_in(cidr: str) -> None:
    """Remove CNI network namespaces whose interfaces hold an address in cidr (only our pods use it)."""
    netns = Path("/var/run/netns")
    if not netns.is_dir():
        return
    net = ipaddress.ip_network(cidr)
    for ns in netns.iterdir():
        if not ns.name.startswith("cni-"):
            continue
        res = subprocess.run(["ip", "-n", ns.name, "-o", "-4", "addr"], capture_output=True, text=True)
        addrs = [w.split("/")[0] for w in res.stdout.split() if "/" in w and w[0].isdigit()]
        if any(ipaddress.ip_address(a) in net for a in addrs) or res.returncode != 0:
            subprocess.run(["umount", "-l", str(ns)], capture_output=True)
            ns.unlink(missing_ok=True)


def _remove_chains(*prefixes: str) -> None:
    """Delete the rules jumping to, and then the chains named with, these prefixes (IPv4 and IPv6).

    Only our nodes' kubelet, kube-proxy and bridge CNI create such chains on this host (up refuses to run
    beside another cluster's real nodes), so every one of them is ours.
    """
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            res = subprocess.run([f"{tool}-save", "-t", table], capture_output=True, text=True)
            if res.returncode != 0:
                continue
            lines = res.stdout.splitlines()
            chains = [ln[1:].split()[0] for ln in lines if ln.startswith(":") and ln[1:].startswith(prefixes)]
            for ln in lines:
                if ln.startswith("-A ") and any(f"-j {c}" in ln or f"--jump {c}" in ln for c in chains):
                    rule = _split_rule(ln.replace("-A ", "-D ", 1))
                    subprocess.run([tool, "-t", table, *rule], capture_output=True)
            for flag in ("-F", "-X"):  # flush all first: chains may jump to each other
                for c in chains:
                    subprocess.run([tool, "-t", table, flag, c], capture_output=True)


def _split_rule(rule: str) -> list[str]:
    import shlex

    return shlex.split(rule)
