"""Autoscaling: the metrics path (KEDA or HPA), the forecast floor, the warm pool, model-load time."""
