"""The Triton Python-backend model file (``model.py``), shipped as package data of the runtime.

Never imported here: the launcher copies ``model.py`` into the model repository, where Triton's Python
stub imports it next to ``triton_python_backend_utils``. This file only makes the folder a package, so a
plain (non-editable) install carries ``model.py``.
"""
