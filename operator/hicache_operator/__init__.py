"""The SGLangHiCache Kubernetes operator (kopf).

Not importable as ``operator`` on purpose: that name is the standard library's.
"""

__version__ = "0.1.0"
