"""Logging: every line about a CR names it as ``[namespace/name]``.

kopf's own per-object loggers carry the CR in a ``k8s_ref`` record attribute, which its
prefixing formatter turns into the ``[namespace/name]`` prefix; :func:`cr_logger` gives the
operator's own messages the same attribute, and :func:`setup` installs that formatter (the plain
``logging.basicConfig`` format drops the reference, and a line about one of 200 CRs that does
not say which is useless).
"""

from __future__ import annotations

import logging

import kopf

log = logging.getLogger("hicache_operator.controller")


def cr_logger(namespace: str, name: str) -> logging.LoggerAdapter[logging.Logger]:
    """A logger whose lines start with ``[namespace/name]`` (never posted as k8s Events)."""
    return logging.LoggerAdapter(log, {"k8s_skip": True,
                                       "k8s_ref": {"namespace": namespace, "name": name}})


def setup(level: str | int, verbose: bool = False) -> None:
    """Root logging with kopf's object-prefixing formatter, at ``level`` (DEBUG if verbose)."""
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.FULL, log_prefix=True)
    logging.getLogger().setLevel(logging.DEBUG if verbose else level)
