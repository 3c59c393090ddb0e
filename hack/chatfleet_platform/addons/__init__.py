"""What the cluster gets beyond Kubernetes itself: CRDs, controllers and data planes a real cluster would add.

The Gateway API (``gatewayapi``: its CRDs; ``gateway``: Traefik serving them, with its own CRDs from
``traefikcrd``), the Inference Extension (``inferenceext``: the InferencePool CRD; ``poolgateway``: Envoy
programmed for pools), KEDA (``keda``) and the Prometheus Operator's part (``scrape``: a PodMonitor as
Prometheus scrape configs).
"""
