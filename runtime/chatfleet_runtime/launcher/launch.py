"""The pod's `triton` container entrypoint (docs/pod-contract.md).

``python3 -m chatfleet_runtime.launcher.launch --config-dir=/etc/chatfleet/triton --repository=/tmp/model-repository
--http-port=8000 --grpc-port=8001 --metrics-port=8002``

1. Read one ``<model>.config.pbtxt`` per model from the config folder (``tritonconfig.config_file_name``),
   which the pod's downward API volume fills from its template's annotations.
2. Place the instances: a pod on a simulated GPU (the local platform's device plugin hands it
   ``CHATFLEET_SIMULATED_GPU=1``) serves with ``KIND_CPU``; a ``KIND_GPU`` config with no CUDA device visible
   and no such marker stops here with a message, never silently serving from the CPU (``place_instances``).
3. If ``CHATFLEET_MODEL_URI`` is set and the weights folder (the ``model_dir`` parameter) is empty, fill it
   from the URI (``chatfleet_runtime.sources.model_sources``: hf, s3, gs, oci, http(s), file, at
   ``CHATFLEET_MODEL_REVISION``), with the credentials the pod's environment carries.
4. Write the model repository: each model's config.pbtxt plus the shipped ``model.py`` adapter.
5. Exec tritonserver (NGC image or the pytriton wheel) on the given ports; Triton's readiness then means
   "model loaded and warm-up generation done".
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from chatfleet_contract.parameters import ModelParameters
from chatfleet_contract.tritonconfig import (
    MODEL_NAME,
    config_file_name,
    instance_kinds,
    on_cpu,
    parse_parameters,
)

from chatfleet_runtime.launcher.tritonhome import (
    Ports,
    command,
    environment,
    find_installation,
    write_repository,
)
from chatfleet_runtime.sources.model_sources import ModelSourceError, fetch

SUFFIX = config_file_name("")  # ".config.pbtxt"
#: Set by the local platform's fake GPU device plugin on every container it allocates a GPU to.
SIMULATED_GPU_ENV = "CHATFLEET_SIMULATED_GPU"


def place_instances(
    configs: dict[str, str], *, simulated: bool, cuda_devices: Callable[[], int]
) -> tuple[dict[str, str], str]:
    """Decide where Triton's instances run: (configs to write, one line saying why).

    - a simulated GPU: every instance group moves to KIND_CPU (the pod is a rehearsal on a CPU node);
    - KIND_GPU with CUDA devices visible: unchanged;
    - KIND_GPU with none visible and no simulated marker: SystemExit. A broken GPU node must fail
      loudly, not serve from the CPU at a fraction of the speed.
    """
    wants_gpu = any("KIND_GPU" in instance_kinds(text) for text in configs.values())
    if simulated:
        return {k: on_cpu(v) for k, v in configs.items()}, (
            f"simulated GPU ({SIMULATED_GPU_ENV}=1 from the device plugin): Triton instances on the CPU"
        )
    visible = cuda_devices() if wants_gpu else 0
    if wants_gpu and visible == 0:
        raise SystemExit(
            "launch: the Triton config asks for KIND_GPU but no CUDA device is visible in this container "
            f"(NVIDIA_VISIBLE_DEVICES={os.environ.get('NVIDIA_VISIBLE_DEVICES', '<unset>')}); refusing to "
            "serve from the CPU. Check the node's NVIDIA driver and device plugin."
        )
    where = f"{visible} CUDA device(s)" if wants_gpu else "the CPU (KIND_CPU in the config)"
    return configs, f"Triton instances on {where}"


def cuda_device_count() -> int:
    """CUDA devices visible to this process (0 without a driver)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def read_configs(config_dir: Path) -> dict[str, str]:
    """{model name: config.pbtxt text} from the mounted config folder."""
    configs = {
        p.name[: -len(SUFFIX)]: p.read_text() for p in sorted(config_dir.glob(f"*{SUFFIX}")) if p.is_file()
    }
    if MODEL_NAME not in configs:
        raise SystemExit(
            f"launch: {config_dir / config_file_name(MODEL_NAME)} is missing (the triton-config volume not mounted?)"
        )
    return configs


def ensure_weights(model_dir: Path, uri: str | None, revision: str | None) -> Path:
    """Fill an empty weights folder from a URI; a folder that already holds a config.json is kept."""
    if (model_dir / "config.json").exists() or not uri:
        return model_dir
    return fetch(uri, model_dir, revision=revision)


def main(argv: list[str] | None = None) -> int:
    """Assemble the repository and exec tritonserver (or print the command with --dry-run)."""
    parser = argparse.ArgumentParser(description="chatfleet triton launcher")
    parser.add_argument("--config-dir", default="/etc/chatfleet/triton")
    parser.add_argument("--repository", default="/tmp/model-repository")
    parser.add_argument("--address", default="127.0.0.1", help="where Triton listens: the pod's loopback")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument(
        "--triton-home", default="/tmp/triton-home", help="backend folder when using the pytriton wheel"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="prepare everything, print the command, do not exec"
    )
    args, extra = parser.parse_known_args(argv)
    configs = read_configs(Path(args.config_dir))
    configs, why = place_instances(
        configs, simulated=os.environ.get(SIMULATED_GPU_ENV) == "1", cuda_devices=cuda_device_count
    )
    print(f"[launch] {why}", flush=True)
    params = ModelParameters.from_parameters(parse_parameters(configs[MODEL_NAME]))
    try:
        ensure_weights(
            Path(params.model_dir),
            os.environ.get("CHATFLEET_MODEL_URI"),
            os.environ.get("CHATFLEET_MODEL_REVISION"),
        )
    except ModelSourceError as e:
        raise SystemExit(f"launch: {e}") from e
    repo = write_repository(Path(args.repository), configs)
    inst = find_installation(Path(args.triton_home))
    cmd = command(inst, repo, Ports(args.http_port, args.grpc_port, args.metrics_port), args.address, extra)
    env = environment(inst, http=f"{args.address}:{args.http_port}")
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    os.chdir("/")  # the Python stub puts cwd on sys.path (see docs/runtime.md)
    sys.stdout.flush()
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
