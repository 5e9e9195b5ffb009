"""The project's pins of the software it runs on: the ONE place they are written.

The engine image (``images/engine/Dockerfile``) installs exactly these versions, and a chart-tier
test (``tests/chart/test_chart_images.py``) fails when a Dockerfile pins anything else, so the
image, the docs and the backend's assumptions (SGLang's storage-backend interface, mori's UMBP
API) cannot drift apart.
"""

from __future__ import annotations

from typing import Final

# SGLang release whose HiCache storage-backend interface (dynamic backend, interface_v1) the
# backend implements; the engine image's ROCm base is the upstream build of this release.
SGLANG_VERSION: Final = "0.5.23"

# amd-mori release whose UMBP client, host allocator and standalone server the backend drives
# (wheels: cp310 manylinux_2_35 and cp312 manylinux_2_39 only).
AMD_MORI_VERSION: Final = "1.2.4"

# ROCm flavour of the upstream SGLang image the engine image builds on: the rocm720 flavour is
# Ubuntu 22.04 + Python 3.10 (glibc 2.35), which is exactly what amd-mori's cp310 wheel needs.
SGLANG_ROCM_FLAVOUR: Final = "rocm720"

# GPU architecture suffix of the upstream SGLang image: mi35x = gfx950 (MI350X / MI355X).
SGLANG_GPU_ARCH_SUFFIX: Final = "mi35x"

# The upstream ROCm SGLang image for MI355X (lmsysorg/sglang release tags follow
# v<version>-<rocm flavour>-<arch>, e.g. v0.5.18-rocm720-mi35x).
ENGINE_BASE_IMAGE: Final = (
    f"lmsysorg/sglang:v{SGLANG_VERSION}-{SGLANG_ROCM_FLAVOUR}-{SGLANG_GPU_ARCH_SUFFIX}"
)

__all__ = [
    "AMD_MORI_VERSION",
    "ENGINE_BASE_IMAGE",
    "SGLANG_GPU_ARCH_SUFFIX",
    "SGLANG_ROCM_FLAVOUR",
    "SGLANG_VERSION",
]
