"""Kopf settings, chosen deliberately (each line says why).

- No diff-base: the CR is handled by ``on.event`` and a level-triggered reconcile (see
  ``handlers``), so kopf never stores a last-handled spec in the CR (``NoDiffBaseStorage``): a
  resync where nothing changed writes nothing, even when kopf's event stream lags.
- Progress (only the delete handler has any) lives in annotations under our own prefix: the
  CRD's status schema is structural, so the API server prunes kopf's default ``status.kopf``
  writes and kopf would re-run handlers forever.
- Our own finalizer name, so ``kubectl get -o yaml`` shows who blocks a deletion.
- Peering: two replicas, one active. Unless run ``--standalone``, peering is mandatory under
  the name ``sglang-hicache-operator`` (the chart creates the KopfPeering object).
- Events are posted explicitly by the handlers (sized, rejected, applied, topology failure);
  kopf's log-to-event bridge stays off so ordinary logs do not spam ``kubectl describe``.
- Server-side label selectors on pods and children: the operator only watches what it owns.
- Bounded retries/backoff on API errors; watch streams are re-established every few minutes.
"""

from __future__ import annotations

from typing import Any

import kopf

ANNOTATION_PREFIX = "hicache.sglang.ai"
FINALIZER = "hicache.sglang.ai/finalizer"
PEERING_NAME = "sglang-hicache-operator"
REPORTING_COMPONENT = "sglang-hicache-operator"
CHILD_SELECTOR = "app.kubernetes.io/name=sglang-hicache"
WATCHED_CHILDREN = (("apps", "v1", "statefulsets"), ("", "v1", "services"),
                    ("", "v1", "configmaps"), ("policy", "v1", "poddisruptionbudgets"),
                    ("", "v1", "pods"))


class NoDiffBaseStorage(kopf.DiffBaseStorage):
    """Keeps no last-handled state: every event looks new to kopf, which only matters for
    changing handlers, and the only one left (``on.delete``) is chosen by the deletion
    timestamp, not by a diff. ``store`` never writes."""

    def fetch(self, *, body: kopf.Body) -> Any:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


def configure(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = NoDiffBaseStorage()

    if not settings.peering.standalone and settings.peering.name == "default":
        settings.peering.name = PEERING_NAME
        settings.peering.mandatory = True

    settings.posting.enabled = True
    settings.posting.loggers = False
    settings.posting.reporting_component = REPORTING_COMPONENT

    for group, version, plural in WATCHED_CHILDREN:
        settings.watching.label_selectors[group, version, plural] = CHILD_SELECTOR
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10

    settings.networking.request_timeout = 30
    settings.networking.error_backoffs = [1, 2, 5, 10]
    settings.execution.max_workers = 8  # our handlers are async; threads only for sync ones
