"""What every part of the platform stands on: where things are, our processes, our certificates.

``config`` (the repository, pinned versions, the binary cache and Go module cache, ``PlatformError``),
``procs`` (start, recognise and stop the platform's own processes; free loopback ports), ``pki`` (a
throwaway CA, serving and client certificates, the kubeconfig), ``gotrim`` (what the Go builds of
KEDA and Traefik leave out) and ``gopatch`` (the bug the Go build of kwok mends), both run by
hack/build-platform.sh. It imports no other part of the platform.
"""
