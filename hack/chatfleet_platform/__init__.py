"""The local platform for Chatfleet: a real Kubernetes control plane, kwok GPU nodes, Prometheus and Redis.

Everything binds 127.0.0.1, all state sits in one working folder, and only processes this package started
(recorded with their PIDs and command lines in that folder) are ever stopped.
"""
