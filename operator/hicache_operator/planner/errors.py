"""The one error the planner raises for a bad CR: every problem at once, with field paths."""

from __future__ import annotations

from collections.abc import Iterable

Problem = tuple[str, str]


class SpecError(ValueError):
    """An invalid ``SGLangHiCache``: ``problems`` lists ``(field_path, message)`` pairs;
    ``reason`` is the ``SpecValid=False`` condition's reason."""

    def __init__(self, problems: Iterable[Problem], reason: str = "InvalidSpec") -> None:
        self.problems: list[Problem] = list(problems)
        self.reason = reason
        lines = "\n".join(f"  - {path}: {message}" for path, message in self.problems)
        super().__init__(f"invalid SGLangHiCache ({len(self.problems)} problem(s)):\n{lines}")


class Problems:
    """Collects problems while planning; :meth:`raise_if_any` raises them together."""

    def __init__(self) -> None:
        self.items: list[Problem] = []
        # Fields that failed to parse and were dropped so the rest of the CR could still be
        # checked: a later problem about them (or their parent object) would only be an echo.
        self.masked: set[str] = set()

    def add(self, path: str, message: str) -> None:
        if not any(_overlaps(path, m) for m in self.masked):
            self.items.append((path, message))

    def extend(self, problems: Iterable[Problem]) -> None:
        for path, message in problems:
            self.add(path, message)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self, reason: str = "InvalidSpec") -> None:
        if self.items:
            raise SpecError(self.items, reason)


def _overlaps(path: str, masked: str) -> bool:
    """``path`` is ``masked``, inside it, or a parent object of it (the spec root excepted)."""
    if path == masked or path.startswith((masked + ".", masked + "[")):
        return True
    return path != "spec" and masked.startswith((path + ".", path + "["))
