"""Stand-in for ``torchvision.transforms.functional``."""

from enum import Enum


class InterpolationMode(Enum):
    """torchvision's interpolation modes with torchvision's string values."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name.startswith("__"):
        raise AttributeError(name)
    from torchvision import _unavailable

    return _unavailable(f"transforms.functional.{name}")
