"""Stand-in for ``torchvision.transforms.v2.functional``."""

from torchvision.transforms.functional import InterpolationMode

__all__ = ["InterpolationMode"]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name.startswith("__"):
        raise AttributeError(name)
    from torchvision import _unavailable

    return _unavailable(f"transforms.v2.functional.{name}")
