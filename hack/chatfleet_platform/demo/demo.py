"""`make demo`: Chatfleet's main job, live, on the local platform.

1. the local Kubernetes: simulated GPU nodes (kwok) for scale and one real node (kubelet + containerd);
2. the CRD installed and the operator started;
3. a ChatbotService reconciled into Triton GPU pods on the right simulated H100 nodes;
4. a ChatbotService on the real node: the project's runtime image runs Triton + the chat API on a tiny
   local model, and a chat goes through the Service;
5. releases on those real pods: a bad canary caught by what it really served and rolled back, a good
   one promoted;
6. (real nodes) InferencePool routing through Envoy Gateway: dialogues kept on the replica holding them.

What is simulated is said as it happens: the kwok nodes run no containers, and the real node's GPUs are
fake (a device plugin), so its pods serve from the CPU. With REAL_NODES=0, step 4 runs the runtime
beside the cluster and step 5 plays the pods' metrics with a traffic simulator.
The cluster and the operator keep running afterwards (the demo prints how to reach and stop them).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

from chatfleet_platform.cluster.cluster import Cluster, default_workdir
from chatfleet_platform.common.config import (
    CHATBOT_CRD_FILE,
    CHATBOT_CRD_NAME,
    LOCAL_ANALYSIS_ARGS,
    LOCAL_HOST_PATH_ARGS,
    REPO_ROOT,
    PlatformError,
)

BOLD, DIM, GREEN, RED, CYAN, RESET = (
    ("\033[1m", "\033[2m", "\033[32m", "\033[31m", "\033[36m", "\033[0m")
    if sys.stdout.isatty()
    else ("",) * 6
)
DEMO_SERVICE = "support-bot"
DEMO_EXAMPLE = REPO_ROOT / "examples" / "02-h100-pinned.yaml"


class Demo:
    """The demo's steps, each printing what it does and what it saw."""

    def __init__(self, workdir: Path, steps: int = 5, real_nodes: int = 1) -> None:
        self.cluster = Cluster(workdir, progress=lambda m: self.say(m, dim=True))
        self.steps = steps
        self.real_nodes = real_nodes
        self.step_no = 0
        self.t0 = time.monotonic()

    # ---- output --------------------------------------------------------------------------------
    def step(self, title: str) -> None:
        """Announce the next step."""
        self.step_no += 1
        print(f"\n{BOLD}[{self.step_no}/{self.steps}] {title}{RESET}", flush=True)

    def say(self, msg: str, *, dim: bool = False, ok: bool = False, bad: bool = False) -> None:
        """One progress line with the elapsed time."""
        color = GREEN if ok else RED if bad else DIM if dim else ""
        print(f"  {DIM}{time.monotonic() - self.t0:6.1f}s{RESET} {color}{msg}{RESET}", flush=True)

    def show(self, text: str) -> None:
        """Indented command output."""
        print(textwrap.indent(text.rstrip(), "      "), flush=True)

    def kubectl_show(self, *args: str) -> None:
        """Run kubectl, echo the command and its output."""
        print(f"    {CYAN}$ kubectl {' '.join(args)}{RESET}", flush=True)
        self.show(self.cluster.kubectl(*args).stdout)

    # ---- steps ---------------------------------------------------------------------------------
    def platform(self) -> None:
        """Step 1: the local Kubernetes with GPU nodes."""
        self.step("A real local Kubernetes: simulated GPU nodes for scale, a real node for real pods")
        if self.real_nodes:
            from chatfleet_platform.cluster import images

            self.say(
                "building the operator and runtime images from their Dockerfiles (cached; cold: minutes)"
            )
            images.ImageBuilder().build(list(images.ALL_NAMES))
        self.cluster.up(nodes=int(os.environ.get("NODES", "4")), real_nodes=self.real_nodes)
        self.kubectl_show(
            "get", "nodes", "-L", "nvidia.com/gpu.product,nvidia.com/gpu.count,chatfleet.io/real-node"
        )
        self.say(
            "simulated: the kwok nodes (gpu-node-*) run no containers; real: chatfleet-real-* runs kubelet, "
            "containerd and runc here, with fake GPUs from a device plugin (its pods serve from the CPU)",
            dim=True,
        )

    def operator(self) -> None:
        """Step 2: the CRD and the operator."""
        self.step("Install the ChatbotService CRD and start the operator")
        self.cluster.install_crd(CHATBOT_CRD_FILE, CHATBOT_CRD_NAME)
        self.say(f"CRD {CHATBOT_CRD_NAME} established", ok=True)
        if not self.cluster.state().get("extras", {}).get("operator") or not self._operator_alive():
            # the host paths the demo's ChatbotServices name: the example's, and the tiny model of step 4
            host_paths = (*LOCAL_HOST_PATH_ARGS, f"--allowed-host-path={self.model_dir}")
            self.cluster.start_extra(
                "operator",
                [
                    sys.executable, "-m", "chatfleet_operator.cli", "run",
                    *LOCAL_ANALYSIS_ARGS, *host_paths, *self._picker_args(),
                ],
            )  # fmt: skip
        self.say(f"operator running (log: {self.cluster.log('operator')})", ok=True)

    def _picker_args(self) -> list[str]:
        """Where step 6's endpoint pickers run: the operator's image, on the real node."""
        if not self.real_nodes:
            return []
        from chatfleet_platform.cluster import images
        from chatfleet_platform.cluster.realnode import PICKER_PLACEMENT_ARGS

        return [f"--picker-image={images.read_refs()['operator']['ref']}", *PICKER_PLACEMENT_ARGS]

    @property
    def model_dir(self) -> Path:
        """Where step 4 builds the tiny model its real pods mount (spec.model.hostPath)."""
        return self.cluster.workdir.parent / "demo-model"

    def _operator_alive(self) -> bool:
        from chatfleet_platform.common import procs

        return procs.is_ours(procs.Proc.from_json(self.cluster.state().get("extras", {}).get("operator")))

    def fleet(self) -> None:
        """Step 3: a ChatbotService becomes Ready on the H100 nodes."""
        self.step("Apply a ChatbotService; the operator reconciles it onto H100 GPU nodes")
        self.say(f"applying {DEMO_EXAMPLE.relative_to(REPO_ROOT)}")
        self.show(DEMO_EXAMPLE.read_text())
        self.cluster.kubectl("apply", "-n", "default", "-f", str(DEMO_EXAMPLE))
        t0 = time.monotonic()
        res = self.cluster.kubectl(
            "wait",
            "-n",
            "default",
            "--for=condition=Ready",
            f"chatbotservice/{DEMO_SERVICE}",
            "--timeout=120s",
            check=False,
        )
        if res.returncode != 0:
            self.kubectl_show("get", "chatbotservice", DEMO_SERVICE, "-n", "default", "-o", "yaml")
            raise PlatformError(f"{DEMO_SERVICE} did not become Ready: {res.stderr.strip()}")
        self.say(f"{DEMO_SERVICE} Ready in {time.monotonic() - t0:.1f}s", ok=True)
        self.kubectl_show("get", "chatbotservices", "-n", "default", "-o", "wide")
        self.kubectl_show(
            "get",
            "deploy,svc,pdb,hpa",
            "-n",
            "default",
            "-l",
            f"chatfleet.io/service={DEMO_SERVICE}",
        )
        pods = json.loads(
            self.cluster.kubectl(
                "get", "pods", "-n", "default", "-l", f"chatfleet.io/service={DEMO_SERVICE}", "-o", "json"
            ).stdout
        )["items"]
        for pod in pods:
            node = pod["spec"].get("nodeName", "")
            product = json.loads(self.cluster.kubectl("get", "node", node, "-o", "json").stdout)["metadata"][
                "labels"
            ].get("nvidia.com/gpu.product", "?")
            gpus = pod["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
            self.say(f"pod {pod['metadata']['name']} on {node} ({product}), {gpus} GPU", ok=True)
        dep = json.loads(
            self.cluster.kubectl("get", "deployment", DEMO_SERVICE, "-n", "default", "-o", "json").stdout
        )
        annotations = dep["spec"]["template"]["metadata"].get("annotations") or {}
        for key, value in sorted(annotations.items()):
            if key.startswith("triton.chatfleet.io/") and key.endswith("config.pbtxt"):
                self.say(
                    f"generated Triton config, in the pod template of deployment/{DEMO_SERVICE} ({key}):"
                )
                self.show("\n".join(value.splitlines()[:14]) + "\n...")
                return

    def chat(self) -> None:
        """Step 4: a ChatbotService on real pods answers a chat through its Service."""
        if not self.real_nodes:
            return self._chat_beside_the_cluster()
        from chatfleet_platform.cluster import images
        from chatfleet_platform.load.realpods import on_real_node, service_url

        from .demo_release import REAL_NAME, REAL_NS

        self.step("A chatbot on real pods: the runtime image on the real node, a chat through the Service")
        from chatfleet_platform.cluster.realnode import readable_by_pods
        from chatfleet_platform.localruntime.tiny import build_tiny_model

        model = readable_by_pods(build_tiny_model(self.model_dir))
        spec = on_real_node(
            {"runtime": {"maxNewTokens": 32, "streaming": True}},
            image=images.read_refs()["runtime"]["ref"],
            model_dir=model,
        )
        doc = {
            "apiVersion": "chatfleet.io/v1alpha1",
            "kind": "ChatbotService",
            "metadata": {"name": REAL_NAME},
            "spec": spec,
        }
        self.say(f"applying {REAL_NAME}: the tiny model by hostPath, image {spec['runtime']['image']}")
        self.cluster.kubectl("apply", "-n", REAL_NS, "-f", "-", input=json.dumps(doc))
        t0 = time.monotonic()
        res = self.cluster.kubectl(
            "wait", "-n", REAL_NS, "--for=condition=Ready", f"chatbotservice/{REAL_NAME}", "--timeout=600s",
            check=False, timeout=620,
        )  # fmt: skip
        if res.returncode != 0:
            self.kubectl_show("get", "pods", "-n", REAL_NS, "-o", "wide")
            raise PlatformError(f"{REAL_NAME} did not become Ready: {res.stderr.strip()}")
        self.say(
            f"{REAL_NAME} Ready in {time.monotonic() - t0:.1f}s: Triton loaded and warmed up in a real pod",
            ok=True,
        )
        self.kubectl_show(
            "get", "pods", "-n", REAL_NS, "-l", f"chatfleet.io/service={REAL_NAME}", "-o", "wide"
        )
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from chatfleet_platform.localruntime.demo import chat_exchange

        url = service_url(self.cluster, REAL_NS, REAL_NAME)
        self.say(f"chatting through the Service {url} (kube-proxy -> the pod's chat API -> Triton)")
        chat_exchange(url, out=lambda line: print(f"    {CYAN}{line}{RESET}", flush=True))
        self.say(
            "(the model is a tiny random one built locally: the words are noise, the serving is real)",
            dim=True,
        )

    def _chat_beside_the_cluster(self) -> None:
        """Step 4 without real nodes: the runtime beside the cluster, from the same config generator."""
        self.step("A chat answered by the real runtime (tritonserver + chat API + Redis, tiny model)")
        self.say(
            "REAL_NODES=0: kwok's simulated nodes run no containers, so the runtime the pods run starts here "
            "on 127.0.0.1, with a config made by the same generator as the one above"
        )
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        from chatfleet_platform.localruntime.demo import chat_exchange
        from chatfleet_platform.localruntime.testing import local_runtime

        with local_runtime(self.cluster.workdir / "runtime") as rt:
            self.say(f"runtime ready: CHAT_API={rt.api_url}", ok=True)
            chat_exchange(rt.api_url, out=lambda line: print(f"    {CYAN}{line}{RESET}", flush=True))

    def releases(self) -> None:
        """Step 5: a bad canary rolled back, a good one promoted."""
        if not self.real_nodes:
            from .demo_release import run_release_demo

            self.step(
                "Releases (simulated traffic: REAL_NODES=0): a bad canary rolled back, a good one promoted"
            )
            return run_release_demo(self)
        from chatfleet_platform.addons.scrape import podmonitor_scrape_configs
        from chatfleet_platform.load.realpods import fleet_podmonitor
        from chatfleet_platform.servers.services import Prometheus

        from .demo_release import run_real_release_demo

        self.step("Releases on the real pods: a bad canary rolled back, a good one promoted")
        configs = podmonitor_scrape_configs(
            fleet_podmonitor(),
            api_server=self.cluster.server,
            pki_dir=self.cluster.workdir / "pki",
            scrape_interval="1s",
        )
        prom = Prometheus(self.cluster.workdir / "demo-prometheus", scrape_configs=configs).start()
        try:
            run_real_release_demo(self, prom)
        finally:
            prom.stop()

    def routing(self) -> None:
        """Step 6 (real nodes): dialogues routed by InferencePools through Envoy Gateway."""
        if not self.real_nodes:
            return
        from .demo_routing import run_routing_demo

        self.step("InferencePool routing through Envoy Gateway: each dialogue stays on its replica")
        run_routing_demo(self)

    def finish(self) -> None:
        """Tell the user how to look around and how to stop."""
        print(
            f"\n{BOLD}Done in {time.monotonic() - self.t0:.0f}s.{RESET} The cluster and the operator are "
            "still running:"
        )
        print(f"    export KUBECONFIG={self.cluster.kubeconfig}")
        kubectl_dir = self.cluster.binaries.kubectl.parent
        print(f"    export PATH={kubectl_dir}:$PATH")
        print("    kubectl get chatbotservices -A -o wide")
        print(f"    operator log: {self.cluster.log('operator')}")
        print("Stop everything with:  make cluster-down")


def main() -> int:
    """Run the demo; exit code 1 with one clear message on a platform problem."""
    real_nodes = int(os.environ.get("REAL_NODES", "1"))
    demo = Demo(default_workdir(), steps=6 if real_nodes else 5, real_nodes=real_nodes)
    print(f"{BOLD}Chatfleet demo{RESET}: GPU chatbot fleets on Triton, released safely")
    try:
        demo.platform()
        demo.operator()
        demo.fleet()
        demo.chat()
        demo.releases()
        demo.routing()
    except PlatformError as e:
        print(f"\n{RED}demo failed: {e}{RESET}", file=sys.stderr)
        print(f"logs: {demo.cluster.workdir / 'logs'}; stop with: make cluster-down", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; stop the cluster with: make cluster-down", file=sys.stderr)
        return 130
    demo.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
