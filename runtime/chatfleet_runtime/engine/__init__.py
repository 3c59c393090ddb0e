"""What runs inside Triton's Python backend: the chat model's core in plain Python (torch, transformers).

``triton_model/model.py`` is the thin adapter Triton loads (copied into the model repository by the
launcher); ``service.ChatService`` is everything the model does, over the in-flight engine, the batch
generator, admission by KV budget, the prefix cache and the loader. Import contract (pyproject.toml): never
imports ``chat`` nor ``launcher``; it shares ``prompting`` with the chat API and ``sources`` with the
launcher.
"""
