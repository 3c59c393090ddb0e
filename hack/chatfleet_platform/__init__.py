"""The local platform for Chatfleet: a real Kubernetes control plane, kwok GPU nodes, Prometheus and Redis.

Everything binds 127.0.0.1, all state sits in one working folder, and only processes this package started
(recorded with their PIDs and command lines in that folder) are ever stopped.

One concept per sub-package, imported one way (an import contract in pyproject.toml):
``cli`` and ``demo`` over ``load`` and ``localruntime``, over ``addons`` and ``servers``, over ``cluster``,
over ``common`` (docs/local-platform.md, "Map of the package").
"""
