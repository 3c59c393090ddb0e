"""The ``chat-api`` container's process: the OpenAI-shaped HTTP server that relays to Triton over gRPC.

``api`` is the entrypoint (thin routes; ``middleware`` the ASGI layer under them), ``pipeline.ChatPipeline``
the chat API without HTTP, ``backend`` Triton's client; sessions, breaker, drain (and its preStop client),
shadow and metrics around them.
Import contract (pyproject.toml): never imports ``engine`` (this process must not load torch), nor
``launcher`` nor ``sources``; it shares ``prompting`` (request checks) with the engine.
"""
