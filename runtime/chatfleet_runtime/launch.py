"""The pod's `triton` container entrypoint (docs/pod-contract.md).

``python3 -m chatfleet_runtime.launch --config-dir=/etc/chatfleet/triton --repository=/tmp/model-repository
--http-port=8000 --grpc-port=8001 --metrics-port=8002``

1. Read one ``<model>.config.pbtxt`` per model from the ConfigMap folder (``tritonconfig.configmap_key``).
2. If ``CHATFLEET_MODEL_URI`` is set and the weights folder (the ``model_dir`` parameter) is empty, fill it
   from the URI (``chatfleet_runtime.model_sources``: hf, s3, gs, oci, http(s), file, at
   ``CHATFLEET_MODEL_REVISION``), with the credentials the pod's environment carries.
3. Write the model repository: each model's config.pbtxt plus the shipped ``model.py`` adapter.
4. Exec tritonserver (NGC image or the pytriton wheel) on the given ports; Triton's readiness then means
   "model loaded and warm-up generation done".
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from chatfleet_runtime.model_sources import ModelSourceError, fetch
from chatfleet_runtime.tritonconfig import MODEL_NAME, configmap_key, parse_parameters
from chatfleet_runtime.tritonhome import Ports, command, environment, find_installation, write_repository

SUFFIX = configmap_key("")  # ".config.pbtxt"


def read_configs(config_dir: Path) -> dict[str, str]:
    """{model name: config.pbtxt text} from the mounted ConfigMap folder."""
    configs = {
        p.name[: -len(SUFFIX)]: p.read_text() for p in sorted(config_dir.glob(f"*{SUFFIX}")) if p.is_file()
    }
    if MODEL_NAME not in configs:
        raise SystemExit(
            f"launch: {config_dir / configmap_key(MODEL_NAME)} is missing (ConfigMap not mounted?)"
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
    parser.add_argument("--address", default="0.0.0.0")
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
    params = parse_parameters(configs[MODEL_NAME])
    try:
        ensure_weights(
            Path(params.get("model_dir", "/models/weights")),
            os.environ.get("CHATFLEET_MODEL_URI"),
            os.environ.get("CHATFLEET_MODEL_REVISION"),
        )
    except ModelSourceError as e:
        raise SystemExit(f"launch: {e}") from e
    repo = write_repository(Path(args.repository), configs)
    inst = find_installation(Path(args.triton_home))
    cmd = command(inst, repo, Ports(args.http_port, args.grpc_port, args.metrics_port), args.address, extra)
    env = environment(inst)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    os.chdir("/")  # the Python stub puts cwd on sys.path (see docs/runtime.md)
    sys.stdout.flush()
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
