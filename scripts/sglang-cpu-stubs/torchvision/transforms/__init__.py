"""Stand-in for ``torchvision.transforms``: ``InterpolationMode`` as a real Enum."""

from torchvision.transforms import functional
from torchvision.transforms.functional import InterpolationMode

__all__ = ["InterpolationMode", "functional"]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name.startswith("__"):
        raise AttributeError(name)
    from torchvision import _unavailable

    return _unavailable(f"transforms.{name}")
