"""A fake NVIDIA device plugin for the real nodes: `python -m chatfleet_platform.cluster.fakegpu --count 4`.

It speaks the kubelet's device-plugin gRPC API (v1beta1) exactly as NVIDIA's plugin does: it registers
`nvidia.com/gpu` with the kubelet, lists N healthy devices, and answers Allocate. So the scheduler counts
the GPUs and the kubelet allocates them like real ones.

What it hands a container differs from NVIDIA's plugin in one deliberate way. NVIDIA's plugin sets
`NVIDIA_VISIBLE_DEVICES`, and a real GPU then appears in the container. This plugin sets that variable too
(to fake ids), plus `CHATFLEET_SIMULATED_GPU=1`. The runtime reads that marker and serves from the CPU
(Triton `KIND_CPU`). A pod on a real GPU node never gets the marker, so if no CUDA device is visible there
the runtime fails loudly instead of serving from the CPU (docs/runtime.md, "Simulated GPUs").

The messages are built from descriptors at import time: a subset of the device-plugin API with the same
package, names and field numbers (proto3 ignores the fields left out), so no generated code is needed.
The kubelet's device-plugin folder is fixed per host (`/var/lib/kubelet/device-plugins`, whatever the
kubelet's --root-dir). The kubelet wipes it when it starts, so the plugin re-registers whenever its
socket disappears.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
RESOURCE = "nvidia.com/gpu"
#: The env var that tells the runtime its GPU is simulated (read by chatfleet_runtime.launcher.launch).
SIMULATED_ENV = "CHATFLEET_SIMULATED_GPU"
API_VERSION = "v1beta1"

log = logging.getLogger("fakegpu")

_S, _B, _M, _I64 = 9, 8, 11, 3  # FieldDescriptorProto types: string, bool, message, int64
_ONE, _MANY = 1, 3  # labels: optional, repeated

#: message -> [(field, number, type, label, message type)]; the `*Entry` messages are map entries.
_MESSAGES: dict[str, list[tuple]] = {
    "Empty": [],
    "DevicePluginOptions": [
        ("pre_start_required", 1, _B, _ONE, None),
        ("get_preferred_allocation_available", 2, _B, _ONE, None),
    ],
    "RegisterRequest": [
        ("version", 1, _S, _ONE, None),
        ("endpoint", 2, _S, _ONE, None),
        ("resource_name", 3, _S, _ONE, None),
        ("options", 4, _M, _ONE, "DevicePluginOptions"),
    ],
    "NUMANode": [("ID", 1, _I64, _ONE, None)],
    "TopologyInfo": [("nodes", 1, _M, _MANY, "NUMANode")],
    "Device": [
        ("ID", 1, _S, _ONE, None),
        ("health", 2, _S, _ONE, None),
        ("topology", 3, _M, _ONE, "TopologyInfo"),
    ],
    "ListAndWatchResponse": [("devices", 1, _M, _MANY, "Device")],
    "ContainerAllocateRequest": [("devices_ids", 1, _S, _MANY, None)],
    "AllocateRequest": [("container_requests", 1, _M, _MANY, "ContainerAllocateRequest")],
    "DeviceSpec": [
        ("container_path", 1, _S, _ONE, None),
        ("host_path", 2, _S, _ONE, None),
        ("permissions", 3, _S, _ONE, None),
    ],
    "ContainerAllocateResponse": [
        ("envs", 1, _M, _MANY, "ContainerAllocateResponse.EnvsEntry"),
        ("devices", 3, _M, _MANY, "DeviceSpec"),
        ("annotations", 4, _M, _MANY, "ContainerAllocateResponse.AnnotationsEntry"),
    ],
    "AllocateResponse": [("container_responses", 1, _M, _MANY, "ContainerAllocateResponse")],
    "PreferredAllocationRequest": [],
    "PreferredAllocationResponse": [],
    "PreStartContainerRequest": [("devices_ids", 1, _S, _MANY, None)],
    "PreStartContainerResponse": [],
}
_MAPS = {"ContainerAllocateResponse": ("EnvsEntry", "AnnotationsEntry")}


def _build_messages() -> dict[str, type]:
    """Message classes of the device-plugin API subset, built from a FileDescriptorProto."""
    fdp = descriptor_pb2.FileDescriptorProto(name="chatfleet_deviceplugin.proto", package=API_VERSION)
    fdp.syntax = "proto3"
    for name, fields in _MESSAGES.items():
        msg = fdp.message_type.add(name=name)
        for entry in _MAPS.get(name, ()):
            nested = msg.nested_type.add(name=entry)
            nested.options.map_entry = True
            nested.field.add(name="key", number=1, type=_S, label=_ONE)
            nested.field.add(name="value", number=2, type=_S, label=_ONE)
        for fname, number, ftype, label, type_name in fields:
            f = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".{API_VERSION}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{API_VERSION}.{name}"))
        for name in _MESSAGES
    }


pb = _build_messages()


def allocate_response(request) -> object:
    """The AllocateResponse for an AllocateRequest: NVIDIA's env var with the ids, plus the simulated marker."""
    out = pb["AllocateResponse"]()
    for creq in request.container_requests:
        ids = ",".join(creq.devices_ids)
        resp = out.container_responses.add()
        resp.envs["NVIDIA_VISIBLE_DEVICES"] = ids
        resp.envs[SIMULATED_ENV] = "1"
        resp.annotations["chatfleet.io/simulated-gpus"] = ids
    return out


class FakeGPUPlugin:
    """The DevicePlugin service: `count` healthy devices named sim-gpu-0..N-1."""

    def __init__(self, count: int) -> None:
        self.ids = [f"sim-gpu-{i}" for i in range(count)]
        self.stopping = False

    def options(self, request, context):
        return pb["DevicePluginOptions"]()

    def list_and_watch(self, request, context):
        log.info("kubelet called ListAndWatch: advertising %d devices", len(self.ids))
        yield pb["ListAndWatchResponse"](devices=[pb["Device"](ID=i, health="Healthy") for i in self.ids])
        while context.is_active() and not self.stopping:  # health never changes: keep the stream open
            time.sleep(1)

    def allocate(self, request, context):
        log.info("Allocate %s", [list(c.devices_ids) for c in request.container_requests])
        return allocate_response(request)

    def preferred(self, request, context):
        return pb["PreferredAllocationResponse"]()

    def pre_start(self, request, context):
        return pb["PreStartContainerResponse"]()

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of `v1beta1.DevicePlugin`."""

        def unary(fn, req: str, resp: str):
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=pb[req].FromString, response_serializer=pb[resp].SerializeToString
            )

        return grpc.method_handlers_generic_handler(
            f"{API_VERSION}.DevicePlugin",
            {
                "GetDevicePluginOptions": unary(self.options, "Empty", "DevicePluginOptions"),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self.list_and_watch,
                    request_deserializer=pb["Empty"].FromString,
                    response_serializer=pb["ListAndWatchResponse"].SerializeToString,
                ),
                "Allocate": unary(self.allocate, "AllocateRequest", "AllocateResponse"),
                "GetPreferredAllocation": unary(
                    self.preferred, "PreferredAllocationRequest", "PreferredAllocationResponse"
                ),
                "PreStartContainer": unary(
                    self.pre_start, "PreStartContainerRequest", "PreStartContainerResponse"
                ),
            },
        )


def serve_and_register(count: int, plugin_dir: Path, endpoint: str) -> grpc.Server:
    """Serve the plugin on plugin_dir/endpoint and register it with the kubelet's socket there."""
    sock = plugin_dir / endpoint
    sock.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((FakeGPUPlugin(count).handler(),))
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as ch:
        register = ch.unary_unary(
            f"/{API_VERSION}.Registration/Register",
            request_serializer=pb["RegisterRequest"].SerializeToString,
            response_deserializer=pb["Empty"].FromString,
        )
        register(
            pb["RegisterRequest"](
                version=API_VERSION,
                endpoint=endpoint,
                resource_name=RESOURCE,
                options=pb["DevicePluginOptions"](),
            ),
            timeout=10,
        )
    log.info("registered %s (%d devices) at %s", RESOURCE, count, sock)
    return server


def main(argv: list[str] | None = None) -> int:
    """Run until killed, re-registering whenever the kubelet restarts (its socket folder is wiped)."""
    ap = argparse.ArgumentParser(prog="fakegpu", description=__doc__.splitlines()[0])
    ap.add_argument("--plugin-dir", type=Path, default=PLUGIN_DIR)
    ap.add_argument("--count", type=int, default=4, help="devices to advertise (default 4)")
    ap.add_argument("--endpoint", default="chatfleet-fake-gpu.sock")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    sock = args.plugin_dir / args.endpoint
    server: grpc.Server | None = None
    while True:
        if server is not None and not sock.exists():
            log.info("socket gone (the kubelet restarted): registering again")
            server.stop(0)
            server = None
        if server is None and (args.plugin_dir / "kubelet.sock").exists():
            try:
                server = serve_and_register(args.count, args.plugin_dir, args.endpoint)
            except grpc.RpcError as e:
                log.warning("registration failed: %s", e.details() if hasattr(e, "details") else e)
                server = None
        time.sleep(1)


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
