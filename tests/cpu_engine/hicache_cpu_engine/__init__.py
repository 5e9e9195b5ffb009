"""Test support: real SGLang 0.5.23 HiCache on a CPU-only machine (see ../README.md).

Nothing here is product code or ships in the engine image. It supplies the three things SGLang
0.5.23 lacks on a CPU without its CUDA kernels: the ``sgl_kernel`` ops CPU mode imports (package
``sgl_kernel``), the host<->device KV transfer ops the host pools call (:mod:`.kvcacheio`), and
a general plugin that turns off pinned host memory (:mod:`.plugin`).
"""
