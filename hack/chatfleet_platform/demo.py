"""`make demo`: Chatfleet's main job, live, on the local platform.

1. the local Kubernetes with simulated GPU nodes;
2. the CRD installed and the operator started;
3. a ChatbotService reconciled into Triton GPU pods on the right nodes;
4. a chat answered by the real runtime (Triton + chat API + Redis) on a tiny local model;
5. releases: a bad canary caught and rolled back, a good one promoted.

The cluster and the operator keep running afterwards (the demo prints how to reach and stop them);
the runtime of step 4 is stopped when the demo ends.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

from .cluster import Cluster, default_workdir
from .config import LOCAL_ANALYSIS_ARGS, REPO_ROOT, PlatformError

BOLD, DIM, GREEN, RED, CYAN, RESET = (
    ("\033[1m", "\033[2m", "\033[32m", "\033[31m", "\033[36m", "\033[0m")
    if sys.stdout.isatty()
    else ("",) * 6
)
CRD = REPO_ROOT / "crds" / "chatfleet.io_chatbotservices.yaml"
DEMO_SERVICE = "support-bot"
DEMO_EXAMPLE = REPO_ROOT / "examples" / "02-h100-pinned.yaml"


class Demo:
    """The demo's steps, each printing what it does and what it saw."""

    def __init__(self, workdir: Path, steps: int = 5) -> None:
        self.cluster = Cluster(workdir, progress=lambda m: self.say(m, dim=True))
        self.steps = steps
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
        self.step("A real local Kubernetes with simulated GPU nodes")
        self.cluster.up(nodes=int(os.environ.get("NODES", "4")))
        self.kubectl_show(
            "get", "nodes", "-L", "nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.memory"
        )

    def operator(self) -> None:
        """Step 2: the CRD and the operator."""
        self.step("Install the ChatbotService CRD and start the operator")
        self.cluster.install_crd(CRD, "chatbotservices.chatfleet.io")
        self.say("CRD chatbotservices.chatfleet.io established", ok=True)
        if not self.cluster.state().get("extras", {}).get("operator") or not self._operator_alive():
            self.cluster.start_extra(
                "operator", [sys.executable, "-m", "chatfleet_operator.cli", "run", *LOCAL_ANALYSIS_ARGS]
            )
        self.say(f"operator running (log: {self.cluster.log('operator')})", ok=True)

    def _operator_alive(self) -> bool:
        from . import procs

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
            "deploy,svc,configmap,pdb,hpa",
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
        cm = json.loads(
            self.cluster.kubectl(
                "get",
                "configmap",
                "-n",
                "default",
                "-l",
                f"chatfleet.io/service={DEMO_SERVICE}",
                "-o",
                "json",
            ).stdout
        )["items"]
        for item in cm:
            for key, value in sorted(item.get("data", {}).items()):
                if key.endswith("config.pbtxt"):
                    self.say(f"generated Triton config {item['metadata']['name']}/{key}:")
                    self.show("\n".join(value.splitlines()[:14]) + "\n...")
                    return

    def chat(self) -> None:
        """Step 4: the real runtime answers a chat, two turns, with a session."""
        self.step("A chat answered by the real runtime (tritonserver + chat API + Redis, tiny model)")
        self.say(
            "kwok's simulated nodes run no containers, so the runtime the pods run starts here on "
            "127.0.0.1, with a config made by the same generator as the ConfigMap above"
        )
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        from chatfleet_runtime.demo import chat_exchange
        from chatfleet_runtime.testing import local_runtime

        with local_runtime(self.cluster.workdir / "runtime") as rt:
            self.say(f"runtime ready: CHAT_API={rt.api_url}", ok=True)
            chat_exchange(rt.api_url, out=lambda line: print(f"    {CYAN}{line}{RESET}", flush=True))
            self.say(
                "(the model is a tiny random one built locally: the words are noise, the serving is real)",
                dim=True,
            )

    def releases(self) -> None:
        """Step 5: a bad canary rolled back, a good one promoted."""
        self.step("Releases: a bad canary rolled back, a good one promoted")
        try:
            from .demo_release import run_release_demo
        except ImportError:
            self.say("release demo not available in this build", bad=True)
            return
        run_release_demo(self)

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
    demo = Demo(default_workdir())
    print(f"{BOLD}Chatfleet demo{RESET}: GPU chatbot fleets on Triton, released safely")
    try:
        demo.platform()
        demo.operator()
        demo.fleet()
        demo.chat()
        demo.releases()
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
