"""Servers beside the cluster that the tests and the demo start and stop, each on 127.0.0.1 in its own folder.

Prometheus and Redis (``services``), the model-URI fetchers' object stores (``objectstores``: S3, Cloud
Storage, an OCI registry, a model hub from ``hubserver``, a file server from ``fileserver``) and addresses
on this host that the local Traefik can send to (``hostbackends``).
"""
