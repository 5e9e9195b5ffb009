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

# SGLang's model gateway (PyPI smg, Rust, runs on CPU), the router the operator deploys in front
# of the pods (images/router). 1.13.0 polls each worker's /v1/loads, which SGLang 0.5.23 serves;
# the older sglang-router 0.3.2 polls /get_load, which 0.5.23 no longer has (both checked on the
# real wheels and server). scripts/build-router-env.sh installs the same version for the tests.
SMG_VERSION: Final = "1.13.0"

# The engine's Python and the oldest glibc its base must have. sglang 0.5.23 ships cp311-cp313
# wheels only and amd-mori 1.2.4 cp310/cp312 only: 3.12 is the one Python both run on, and
# amd-mori's cp312 wheel is manylinux_2_39 (glibc >= 2.39, an Ubuntu 24.04 base). The test
# engine environment (scripts/build-engine-env.sh) is the same pairing; a test checks both
# against the installed wheels' tags (tests/chart/test_image_platform_mori.py) and the image
# build verifies its base.
ENGINE_PYTHON: Final = "3.12"
ENGINE_MIN_GLIBC: Final = "2.39"

# ROCm flavour of the upstream SGLang image the engine image builds on. rocm720 is Ubuntu 22.04 +
# Python 3.10 (glibc 2.35), which can hold neither sglang 0.5.23 nor mori's cp312 wheel; the
# rocm724 flavour moved to Ubuntu 24.04 + Python 3.12 (unverified here: no registry access; the
# Dockerfile's first RUN fails the build with the numbers if the base does not match).
SGLANG_ROCM_FLAVOUR: Final = "rocm724"

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
    "ENGINE_MIN_GLIBC",
    "ENGINE_PYTHON",
    "SGLANG_GPU_ARCH_SUFFIX",
    "SGLANG_ROCM_FLAVOUR",
    "SGLANG_VERSION",
]
