"""The local Kubernetes: the control plane, the simulated (kwok) GPU fleet and the real nodes.

``cluster`` (etcd, the API server, controller manager, scheduler and kwok; their extras; ``down``),
``nodes`` (the kwok GPU Node manifests) with ``kwok-stages.yaml`` (how kwok plays their pods), ``realnode``
(kubelet, containerd, runc and bridge CNI on this host), ``fakegpu`` (the real nodes' device plugin),
``nodestore`` (a real node's containerd image store kept between runs) and ``images`` (the images the real
nodes run, built here with no registry).
"""
