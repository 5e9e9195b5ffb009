"""Samples of named metric families from Prometheus text exposition, parsed by
``prometheus_client``'s own parser (``prometheus_client.parser``).

The operator's cache status (``hicache_operator.cachestats``) and the engine's drain
(``hicache_umbp.drain``) read SGLang's ``/metrics`` page through this one function, so both read
it the same way, as Prometheus' own client library does. Lines of other families are dropped
before parsing: a real page holds hundreds of histogram lines neither reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ExpositionError", "Sample", "samples"]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


class ExpositionError(ValueError):
    """A line of a wanted family that is not valid exposition text."""


def samples(text: str, names: Iterable[str]) -> list[Sample]:
    """The samples named one of ``names`` in exposition ``text``, in page order."""
    wanted = tuple(names)
    lines = [line for raw in text.splitlines() if (line := raw.strip()).startswith(wanted)]
    if not lines:
        return []
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except (ValueError, IndexError, KeyError) as exc:
        raise ExpositionError(f"{exc} (in the lines of {', '.join(wanted)})") from None
    return [Sample(s.name, dict(s.labels), float(s.value))
            for family in families for s in family.samples if s.name in wanted]
