"""Label and field selectors as the API server parses them from query strings.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``,
comma-joined (AND). Field selectors: ``metadata.name``, ``metadata.namespace`` and any dotted
path with ``=``, ``==`` or ``!=``.
"""

from __future__ import annotations

import re
from typing import Any

_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


def matches_labels(selector: str, labels: dict[str, str]) -> bool:
    for term in _terms(selector or ""):
        set_term = _SET_TERM.match(term)
        if set_term:
            key, op, values = set_term.groups()
            allowed = {v.strip() for v in values.split(",")}
            if (labels.get(key) in allowed) != (op == "in") or (op == "in" and key not in labels):
                return False
        elif "!=" in term:
            key, value = (p.strip() for p in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (p.strip() for p in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def matches_fields(selector: str, obj: dict[str, Any]) -> bool:
    for term in _terms(selector or ""):
        negate = "!=" in term
        key, value = (p.strip() for p in term.replace("==", "=").replace("!=", "=").split("=", 1))
        actual = _dig(obj, key)
        actual_text = "" if actual is None else str(actual)
        if (actual_text == value) == negate:
            return False
    return True
