"""The local Kubernetes: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok GPU nodes.

All on 127.0.0.1 with ports picked free, certificates made here, and all state in one working folder:

    workdir/state.json    ports and PIDs of what we started (the only processes `down` will stop)
    workdir/pki/          CA, serving, admin and service-account keys
    workdir/kubeconfig    admin kubeconfig (system:masters)
    workdir/etcd/         etcd data
    workdir/logs/*.log    one log per process
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chatfleet_platform.common import pki, procs
from chatfleet_platform.common.config import (
    REPO_ROOT,
    Binaries,
    PlatformError,
    read_json,
    read_versions,
    require_binaries,
    write_json,
)

from . import apireader, realnode
from . import nodes as nodes_mod

STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")
SERVICE_CIDR = "10.96.0.0/16"  # room for thousands of Services (one ClusterIP per ChatbotService)
POD_CIDR = "10.244.0.0/16"
NODE_LEASE_SECONDS = 40  # the simulated nodes' lease (kwok renews it); see Cluster.up
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
CONTROLLERS = (
    "deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,"
    "serviceaccount-controller,serviceaccount-token-controller,horizontal-pod-autoscaler-controller,"
    "node-lifecycle-controller,pod-garbage-collector-controller,endpointslice-controller,"
    "endpoints-controller,root-ca-certificate-publisher-controller,clusterrole-aggregation-controller,"
    "resourcequota-controller,job-controller,statefulset-controller,daemonset-controller,"
    "disruption-controller,taint-eviction-controller,ttl-after-finished-controller,"
    "persistentvolume-binder-controller"
)


def default_workdir() -> Path:
    """Working folder of `make cluster-up`: $CHATFLEET_CLUSTER_DIR or <repo>/.work/cluster."""
    return Path(os.environ.get("CHATFLEET_CLUSTER_DIR") or REPO_ROOT / ".work" / "cluster")


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class Cluster:
    """One local cluster living in `workdir`."""

    workdir: Path = field(default_factory=default_workdir)
    progress: Progress = _quiet
    _reader: apireader.ApiReader | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()

    # ---- paths and state -------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig."""
        return self.workdir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    def state(self) -> dict:
        """The recorded ports and PIDs ({} when never started)."""
        return read_json(self.state_file)

    def _save(self, state: dict) -> None:
        write_json(self.state_file, state)

    def log(self, name: str) -> Path:
        """Log file of a component."""
        return self.workdir / "logs" / f"{name}.log"

    @property
    def server(self) -> str:
        """The API server URL."""
        return f"https://127.0.0.1:{self.state()['ports']['apiserver']}"

    @property
    def binaries(self) -> Binaries:
        return require_binaries()

    @property
    def env(self) -> dict[str, str]:
        """Environment for tools and tests: KUBECONFIG set and kubectl/helm on PATH."""
        bins = self.binaries
        path = os.pathsep.join([*map(str, bins.bin_dirs), os.environ.get("PATH", "")])
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def running(self) -> dict[str, bool]:
        """Component -> whether our recorded process is alive."""
        return {c: procs.is_ours(self._proc(c)) for c in COMPONENTS}

    def _proc(self, name: str) -> procs.Proc | None:
        return procs.Proc.from_json(self.state().get("pids", {}).get(name))

    def is_up(self) -> bool:
        """All components alive and the API server ready."""
        if not all(self.running().values()):
            return False
        try:
            return self._readyz()
        except Exception:
            return False

    # ---- kubectl -----------------------------------------------------------------------------------
    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        namespace: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises PlatformError with stderr when check fails."""
        argv = [str(self.binaries.kubectl), *(["-n", namespace] if namespace else []), *args]
        res = self._read(args, namespace, argv, timeout) if input is None else None
        if res is None:
            res = subprocess.run(
                argv, input=input, capture_output=True, text=True, env=self.env, timeout=timeout
            )
        if check and res.returncode != 0:
            raise PlatformError(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
        return res

    def _read(
        self, args: Sequence[str], namespace: str | None, argv: Sequence[str], timeout: float
    ) -> subprocess.CompletedProcess[str] | None:
        """kubectl's answer to a plain `get` of JSON or names, read over a kept connection (apireader: no
        kubectl process); None for every other call, or when the reader cannot answer as kubectl would.
        CHATFLEET_PLAIN_READS=kubectl sends every call to kubectl."""
        get = apireader.parse(args, namespace)
        if get is None or os.environ.get("CHATFLEET_PLAIN_READS") == "kubectl":
            return None
        try:
            port = int(self.state()["ports"]["apiserver"])
            reader = self._reader
            if reader is None or reader.port != port:  # the first read, or the API server moved
                reader = self._reader = apireader.ApiReader("127.0.0.1", port, self._ssl())
            return reader.get(get, argv, timeout)
        except (apireader.Unanswered, KeyError, OSError):
            return None

    def apply(self, manifests: Sequence[dict], *, namespace: str | None = None) -> None:
        """kubectl apply a list of manifests (server-side)."""
        text = yaml.safe_dump_all(list(manifests), sort_keys=False)
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=text, namespace=namespace
        )

    # ---- lifecycle ---------------------------------------------------------------------------------
    def up(
        self,
        *,
        nodes: int = 4,
        taint: bool = False,
        real_nodes: int = 0,
        gpus: int = 4,
        timeout: float = 120,
        hpa_sync_seconds: int = 15,
        node_lease_seconds: int = NODE_LEASE_SECONDS,
    ) -> float:
        """Start everything (harmless when already running); returns seconds to ready.

        `nodes` simulated GPU nodes (kwok) and `real_nodes` real ones (kubelet + containerd on this host,
        `gpus` fake GPUs on each; see realnode.py). `hpa_sync_seconds`: how often the HPA controller
        evaluates (kube-controller-manager's default 15 s; the autoscaling benchmark compresses it).
        `node_lease_seconds`: the simulated nodes' lease, which kwok renews about every quarter of it; the
        node controller waits as long (at least its default 50 s) before it takes a node for gone. Only
        thousands of simulated nodes on a saturated machine need it longer: their renewals fall behind
        and the node controller marks pods NotReady that kwok then never makes Ready again.
        """
        t0 = time.monotonic()
        bins = self.binaries
        if self.is_up():
            self.progress(f"cluster already running in {self.workdir}")
            if real_nodes > self.realnodes.running():
                self.add_real_nodes(real_nodes, gpus=gpus)
            return 0.0
        if self.state():
            self.progress("found a partly running cluster: stopping what is left and starting afresh")
            self.down()
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = {
            "etcd_client": procs.free_port(),
            "etcd_peer": procs.free_port(),
            "etcd_metrics": procs.free_port(),
            "apiserver": procs.free_port(6443),
            "controller_manager": procs.free_port(),
            "scheduler": procs.free_port(),
        }
        if len(set(ports.values())) != len(ports):
            raise PlatformError(f"port selection collided: {ports}; try again")
        state = {"ports": ports, "pids": {}, "versions": read_versions(), "nodes": nodes}
        self._save(state)

        pki_dir = self.workdir / "pki"
        pki.generate(pki_dir)

        def write_kubeconfig() -> None:
            """The kubeconfig for the API server's port (written again if that port changes)."""
            self.kubeconfig.write_text(pki.kubeconfig(f"https://127.0.0.1:{ports['apiserver']}", pki_dir))
            self.kubeconfig.chmod(0o600)

        write_kubeconfig()
        self.progress(f"certificates and kubeconfig written to {self.workdir}")

        def launch(name: str, argv: list[str]) -> procs.Proc:
            proc = procs.start(name, argv, log=self.log(name), cwd=self.workdir)
            state["pids"][name] = proc.to_json()
            self._save(state)
            return proc

        # 1. etcd
        proc = launch("etcd", self._etcd_args(bins, ports))
        dt = procs.wait_for(
            "etcd",
            lambda: procs.http_ok(f"http://127.0.0.1:{ports['etcd_metrics']}/readyz"),
            timeout=30,
            log=self.log("etcd"),
            proc=proc,
        )
        self.progress(f"etcd ready on 127.0.0.1:{ports['etcd_client']} ({dt:.1f}s)")

        # 2. kube-apiserver. Its port is picked before it listens: another cluster starting beside this one
        # (the other lane of `make test`, whose real-pod layer restarts its cluster) may take it meanwhile,
        # most likely the preferred 6443. Then it starts again on another port.
        for attempt in range(3):
            proc = launch("kube-apiserver", self._apiserver_args(bins, ports, pki_dir))
            try:
                dt = procs.wait_for(
                    "kube-apiserver",
                    self._readyz,
                    timeout=timeout,
                    log=self.log("kube-apiserver"),
                    proc=proc,
                )
                break
            except PlatformError as exc:
                if attempt == 2 or "address already in use" not in str(exc):
                    raise
                taken = ports["apiserver"]
                ports["apiserver"] = procs.free_port()
                self._save(state)
                write_kubeconfig()
                self.progress(
                    f"kube-apiserver: port {taken} was taken meanwhile; trying {ports['apiserver']}"
                )
        self.progress(f"kube-apiserver ready on https://127.0.0.1:{ports['apiserver']} ({dt:.1f}s)")

        # 3. controller-manager and scheduler
        kcm = launch(
            "kube-controller-manager",
            self._kcm_args(bins, ports, pki_dir, hpa_sync_seconds, node_lease_seconds),
        )
        scheduler = launch("kube-scheduler", self._scheduler_args(bins, ports))

        # 4. kwok with our stages, then the GPU nodes
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text(STAGES_FILE.read_text())
        kwok = launch(
            "kwok",
            [
                str(bins.kwok),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                # only the simulated nodes (nodes.py annotates them kwok.x-k8s.io/node=fake): with
                # --manage-all-nodes kwok takes a real kubelet's node over and fakes its pods' status
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.0.0.2",
                f"--node-lease-duration-seconds={node_lease_seconds}",
            ],
        )
        fleet = nodes_mod.fleet(nodes, taint=taint)
        self.add_nodes(fleet)
        dt = procs.wait_for(
            "GPU nodes",
            lambda: self._ready_nodes() >= nodes,
            timeout=timeout,
            log=self.log("kwok"),
            proc=kwok,
            interval=0.3,
        )
        self.progress(f"{nodes} simulated GPU nodes Ready ({dt:.1f}s)")
        procs.wait_for(
            "default ServiceAccount",
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            timeout=timeout,
            log=self.log("kube-controller-manager"),
            proc=kcm,
        )
        procs.wait_for(
            "kube-scheduler",
            lambda: procs.http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz", _unverified()),
            timeout=timeout,
            log=self.log("kube-scheduler"),
            proc=scheduler,
        )
        if real_nodes:
            self.add_real_nodes(real_nodes, gpus=gpus)
        total = time.monotonic() - t0
        self.progress(f"cluster ready in {total:.1f}s")
        return total

    @property
    def realnodes(self) -> realnode.RealNodes:
        """The real nodes of this cluster (started by up(real_nodes=N) or add_real_nodes)."""
        return realnode.RealNodes(self, self.progress)

    def add_real_nodes(
        self, count: int, *, gpus: int = 4, image_names: Sequence[str] | None = None
    ) -> list[realnode.NodePlan]:
        """Start `count` real nodes (kubelet + containerd) with images imported (all built ones by default)."""
        from . import images, nodestore

        names = list(image_names or images.LOAD_ORDER)
        refs = images.read_refs()
        missing = [n for n in names if n not in refs]
        if missing:
            raise PlatformError(f"images {', '.join(missing)} not built yet: run `make images`")

        def load(socket: Path, which: Sequence[str]) -> None:
            images.load_images(socket, [n for n in names if n in which], progress=self.progress)

        node_images = nodestore.NodeImages(nodestore.refs_for(refs, names), load)
        return self.realnodes.up(count, gpus=gpus, images=node_images)

    def install_crd(self, path: Path, name: str, timeout: float = 60) -> None:
        """Apply a CRD file (server-side) and wait until the API serves it (Established)."""
        self.install_crds(path, (name,), timeout)

    def install_crds(self, path: Path, names: Sequence[str], timeout: float = 60) -> None:
        """Apply CRDs (a file or a folder, server-side) and wait until the API serves all of `names`."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        deadline = time.monotonic() + timeout
        while True:  # right after the apply a CRD may have no status yet, and `kubectl wait` errors
            res = self.kubectl(
                "wait",
                "--for=condition=Established",
                f"--timeout={timeout:.0f}s",
                *[f"crd/{n}" for n in names],
                check=False,
            )
            if res.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise PlatformError(
                    f"CRDs {', '.join(names)} not Established after {timeout:.0f}s: {res.stderr.strip()}"
                )
            time.sleep(0.5)

    def uninstall_crds(self, group: str, names: Sequence[str], timeout: float = 60) -> None:
        """Delete CRDs of one API group, wait until the API no longer serves the group, then create and
        delete a placeholder CRD of that group.

        The placeholder is for watchers that rescan a group on its CRD events, as kopf does: the last
        deletion's event can reach them before API discovery has dropped the group, and they keep the
        deleted resources. kopf 1.45 then starts a watch of such a resource for the next namespace that
        appears, gets 404 and stops the whole operator (its orchestrator fails). A CRD event of the group
        once discovery has settled makes them rescan and see the group gone.
        """
        self._delete_crds(names, timeout)
        procs.wait_for(
            f"the API to stop serving {group} once its CRDs are deleted",
            lambda: self.kubectl("get", "--raw", f"/apis/{group}", check=False).returncode != 0,
            timeout=timeout,
            interval=0.5,
        )
        placeholder = placeholder_crd(group)
        name = placeholder["metadata"]["name"]
        self.apply([placeholder])
        self.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/{name}", check=False)
        self._delete_crds([name], timeout, no_instances=True)

    def _delete_crds(self, names: Sequence[str], timeout: float, *, no_instances: bool = False) -> None:
        """Delete CRDs and wait until they are gone; PlatformError naming their conditions if they stay.

        `no_instances`: CRDs that never had objects (the placeholder). If one is still there after half of
        `timeout`, its cleanup finalizer (which only deletes the CRD's objects) is removed: once, under a
        loaded API server, such a deletion stayed pending for over two minutes.
        """
        self.kubectl("delete", "crd", "--ignore-not-found", "--wait=false", *names, check=False)

        def left() -> list[str]:
            res = self.kubectl("get", "crd", *names, "--ignore-not-found", "-o", "name", check=False)
            return res.stdout.split()

        deadline = time.monotonic() + timeout
        unstuck = not no_instances
        while remaining := left():
            if not unstuck and time.monotonic() > deadline - timeout / 2:
                for name in remaining:
                    self.kubectl(
                        "patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
                    )
                unstuck = True
                # the removal gets its own half of `timeout`: under a loaded API server the calls before
                # it can use up the whole of it, and the CRD goes only after the patch
                deadline = max(deadline, time.monotonic() + timeout / 2)
            if time.monotonic() > deadline:
                res = self.kubectl("get", "crd", *names, "--ignore-not-found", "-o", "json", check=False)
                found = json.loads(res.stdout or "{}")  # a List for several names, the object for one
                items = found.get("items", [found] if found else [])
                if not items:  # gone between the last look and this one
                    return
                conditions = "; ".join(
                    f"{o['metadata']['name']} "
                    + ", ".join(
                        f"{c['type']}={c['status']} ({c.get('message', '')})"
                        for c in o.get("status", {}).get("conditions", [])
                    )
                    for o in items
                )
                raise PlatformError(f"CRDs still present {timeout:.0f}s after their deletion: {conditions}")
            time.sleep(0.5)

    def delete_namespace(self, name: str, *, first: Sequence[str] = (), timeout: float = 90) -> None:
        """Delete namespace `name` and wait (up to `timeout` per step) until it is gone.

        Its workloads go first, and their pods are waited for: the namespace controller, finding pods still
        terminating, retries only after their remaining grace period (its estimate of how long they need),
        so a namespace whose pods drain in 10 s would otherwise stay for their whole grace period (45-75 s
        for runtime pods). `first`: kinds to delete before the workloads, such as a custom resource whose
        operator would otherwise create them again. Best effort: failures leave the namespace deletion to
        finish it.
        """
        wait = ("--wait=true", f"--timeout={int(timeout)}s")
        for kinds in (*first, "deployments,statefulsets,replicasets,pods"):
            self.kubectl("delete", kinds, "--all", *wait, namespace=name, check=False, timeout=timeout + 30)
        self.kubectl("delete", "namespace", name, *wait, check=False, timeout=timeout + 30)

    def add_nodes(self, manifests: Sequence[dict]) -> None:
        """Create Node objects with their status (kwok keeps capacity and marks them Ready)."""
        text = yaml.safe_dump_all(list(manifests), sort_keys=False)
        res = self.kubectl("create", "-f", "-", input=text, check=False)
        if res.returncode != 0 and "AlreadyExists" not in res.stderr:
            raise PlatformError(f"creating GPU nodes failed: {res.stderr.strip()}")

    def start_extra(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None) -> procs.Proc:
        """Start a further process (the operator, the runtime) that `down` will stop with the cluster."""
        proc = procs.start(name, argv, log=self.log(name), env=env or self.env, cwd=REPO_ROOT)
        state = self.state()
        state.setdefault("extras", {})[name] = proc.to_json()
        self._save(state)
        return proc

    def stop_extra(self, name: str) -> bool:
        """Stop a process started with start_extra; whether it was running."""
        state = self.state()
        proc = procs.Proc.from_json(state.get("extras", {}).pop(name, None))
        self._save(state)
        return procs.stop(proc)

    def down(self) -> list[str]:
        """Stop exactly the processes we recorded (extras first, then reverse start order), remove the folder."""
        stopped = []
        stopped += self.realnodes.down()  # first: the kubelets tear their pods down through the API
        for name, value in self.state().get("extras", {}).items():
            proc = procs.Proc.from_json(value)
            if procs.stop(proc):
                stopped.append(name)
                self.progress(f"stopped {name} (pid {proc.pid})")
        for name in reversed(COMPONENTS):
            proc = self._proc(name)
            if procs.stop(proc):
                stopped.append(name)
                self.progress(f"stopped {name} (pid {proc.pid})")
        if self.workdir.exists():
            _rmtree(self.workdir)
        return stopped

    # ---- health ------------------------------------------------------------------------------------
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.workdir / "pki" / "ca.crt"))
        ctx.load_cert_chain(str(self.workdir / "pki" / "admin.crt"), str(self.workdir / "pki" / "admin.key"))
        return ctx

    def _readyz(self) -> bool:
        with urllib.request.urlopen(f"{self.server}/readyz", context=self._ssl(), timeout=3) as r:
            return r.status == 200

    def _ready_nodes(self) -> int:
        res = self.kubectl("get", "nodes", "-l", f"{nodes_mod.FLEET_LABEL}=true", "-o", "json", check=False)
        if res.returncode != 0:
            return 0
        count = 0
        for n in json.loads(res.stdout)["items"]:
            conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
            count += conds.get("Ready") == "True"
        return count

    @property
    def gpu_products(self) -> dict[str, int]:
        """GPU product -> GPUs per node in this fleet."""
        return nodes_mod.products(nodes_mod.fleet(self.state().get("nodes", 4)))

    def memory_rss_mib(self) -> dict[str, float]:
        """Resident memory of each running component, in MiB."""
        out = {}
        for name in COMPONENTS:
            proc = self._proc(name)
            if procs.is_ours(proc):
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1]) / 1024
        return out

    # ---- component flags ---------------------------------------------------------------------------
    def _etcd_args(self, b: Binaries, p: dict) -> list[str]:
        peer = f"http://127.0.0.1:{p['etcd_peer']}"
        client = f"http://127.0.0.1:{p['etcd_client']}"
        return [
            str(b.etcd),
            "--name=node0",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=node0={peer}",
            f"--listen-metrics-urls=http://127.0.0.1:{p['etcd_metrics']}",
            "--auto-compaction-retention=1",
            "--quota-backend-bytes=8589934592",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_args(self, b: Binaries, p: dict, k: Path) -> list[str]:
        return [
            str(b.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{p['etcd_client']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['apiserver']}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={k / 'apiserver.crt'}",
            f"--tls-private-key-file={k / 'apiserver.key'}",
            f"--client-ca-file={k / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={k / 'sa.pub'}",
            f"--service-account-signing-key-file={k / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            # logs/exec/port-forward on a real node: dial its InternalIP (its hostname resolves nowhere)
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # the aggregation layer (APIServices such as a metrics adapter's): the API server proxies as
            # front-proxy-client. It dials a Service's ClusterIP, or an ExternalName Service's name: the
            # platform's adapters sit behind ExternalName "localhost" Services, on 127.0.0.1
            f"--requestheader-client-ca-file={k / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={k / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={k / 'front-proxy-client.key'}",
            # CHATFLEET_APISERVER_PROFILING=1: /debug/pprof for a CPU profile (docs/benchmarks.md)
            f"--profiling={'true' if os.environ.get('CHATFLEET_APISERVER_PROFILING') == '1' else 'false'}",
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            *self._audit_args(),
            "--v=0",
        ]

    def _audit_args(self) -> list[str]:
        """CHATFLEET_APISERVER_AUDIT_LOG=FILE: every list and watch (who, what, when it ended) written to
        FILE as the API server's audit events (docs/benchmarks.md), to see which client watches or lists
        again; nothing else is audited, and nothing at all without it."""
        log = os.environ.get("CHATFLEET_APISERVER_AUDIT_LOG")
        if not log:
            return []
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n"
            "- level: Metadata\n  verbs: [list, watch]\n- level: None\n"
        )
        return [f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-maxbackup=0"]

    def _kcm_args(
        self,
        b: Binaries,
        p: dict,
        k: Path,
        hpa_sync_seconds: int = 15,
        node_lease_seconds: int = NODE_LEASE_SECONDS,
    ) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            str(b.kube_controller_manager),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['controller_manager']}",
            "--leader-elect=false",
            f"--service-account-private-key-file={k / 'sa.key'}",
            f"--root-ca-file={k / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--controllers={CONTROLLERS}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--concurrent-deployment-syncs=10",
            "--concurrent-replicaset-syncs=10",
            f"--horizontal-pod-autoscaler-sync-period={hpa_sync_seconds}s",
            f"--node-monitor-grace-period={max(50, node_lease_seconds)}s",
            "--profiling=false",
            "--v=0",
        ]

    def _scheduler_args(self, b: Binaries, p: dict) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            str(b.kube_scheduler),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['scheduler']}",
            "--leader-elect=false",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--profiling=false",
            "--v=0",
        ]


class NamespaceReaper:
    """Deletes namespaces in the background, each as `Cluster.delete_namespace` does (`first` kinds, then
    the workloads with their pods waited for, then the namespace), so that a caller goes on while their pods
    drain. `finish` waits for every deletion and returns the namespaces that still exist."""

    def __init__(self, cluster: Cluster, first: Sequence[str] = ()) -> None:
        self.cluster, self.first = cluster, tuple(first)
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="reaper")
        self.pending: list[tuple[str, Future]] = []

    def delete(self, ns: str) -> None:
        """Start deleting ns."""
        self.pending.append((ns, self.pool.submit(self.cluster.delete_namespace, ns, first=self.first)))

    def finish(self) -> list[str]:
        """Wait for every deletion; the namespaces that still exist."""
        for _, done in self.pending:
            done.result()
        self.pool.shutdown()
        return [
            ns
            for ns, _ in self.pending
            if self.cluster.kubectl("get", "namespace", ns, "-o", "name", check=False).returncode == 0
        ]


def _unverified() -> ssl.SSLContext:
    """A TLS context that checks no certificate (the scheduler's self-signed health port)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def placeholder_crd(group: str) -> dict:
    """A CRD of `group` that nothing watches (see Cluster.uninstall_crds). Pure.

    Groups under k8s.io need the api-approved annotation; "unapproved, ..." is accepted.
    e.g. placeholder_crd("traefik.io")["metadata"]["name"] == "chatfleetplaceholders.traefik.io".
    """
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"chatfleetplaceholders.{group}",
            "annotations": {"api-approved.kubernetes.io": "unapproved, a local test platform placeholder"},
        },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "plural": "chatfleetplaceholders",
                "singular": "chatfleetplaceholder",
                "kind": "ChatfleetPlaceholder",
            },
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
