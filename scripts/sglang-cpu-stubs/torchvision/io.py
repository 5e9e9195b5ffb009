"""Stand-in for ``torchvision.io``: the enum transformers imports, functions that refuse."""

from enum import Enum


class ImageReadMode(Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4
    RGBA = RGB_ALPHA  # alias, as in torchvision


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name.startswith("__"):
        raise AttributeError(name)
    from torchvision import _unavailable

    return _unavailable(f"io.{name}")
