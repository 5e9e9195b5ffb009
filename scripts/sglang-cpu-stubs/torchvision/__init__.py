"""CPU stand-in for torchvision (see scripts/sglang-cpu-stubs/README.md): imports only.

The version is the one transformers 5.19 gates on; no image operation is implemented.
"""

from torchvision import io, transforms

__version__ = "0.29.0+hicache.cpu.standin"
__all__ = ["io", "transforms"]


def _unavailable(name: str):  # type: ignore[no-untyped-def]
    def fail(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError(
            f"torchvision.{name} is not available: this venv carries a CPU import stand-in for "
            "torchvision (scripts/sglang-cpu-stubs), not the real package"
        )

    fail.__name__ = name.rsplit(".", 1)[-1]
    return fail
