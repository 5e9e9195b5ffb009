"""The one error the planner raises for a bad CR: every problem at once, with field paths."""

from __future__ import annotations

from collections.abc import Iterable

Problem = tuple[str, str]


class SpecError(ValueError):
    """An invalid ``SGLangHiCache``: ``problems`` lists ``(field_path, message)`` pairs."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        lines = "\n".join(f"  - {path}: {message}" for path, message in self.problems)
        super().__init__(f"invalid SGLangHiCache ({len(self.problems)} problem(s)):\n{lines}")


class Problems:
    """Collects problems while planning; :meth:`raise_if_any` raises them together."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def extend(self, problems: Iterable[Problem]) -> None:
        self.items.extend(problems)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(self.items)
