"""The ``triton`` container's own processes, before and beside Triton: the launcher and the exec probe.

``launch`` assembles the model repository (the Triton model file from ``engine/triton_model``, copied as a
file, never imported) and execs tritonserver; ``probe`` is the kubelet's exec probe. Import contract
(pyproject.toml): neither imports ``engine`` nor ``chat``; weights come through ``sources``.
"""
