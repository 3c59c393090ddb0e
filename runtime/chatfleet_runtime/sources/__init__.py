"""Model URIs fetched into local folders: the launcher's weights and the engine's ``tokenizer_uri``.

Shared by two processes (the launcher before Triton starts, the engine inside Triton), so it imports
neither: standard library plus each scheme's client library, imported where a fetch needs it.
"""
