"""The pod contract shared by the operator and the runtime: the Triton model configuration.

Standard library only, installed in both images: the operator writes the config with it, the runtime
reads it back with it, so the two can never disagree on a name, a format or a default.
"""
