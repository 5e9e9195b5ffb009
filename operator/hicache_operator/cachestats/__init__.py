"""``status.cache``: the engines' own cache figures, from SGLang's ``/metrics`` to the CR.

The path, one module each:

1. :mod:`.observer` -- on the resync timer only, scrape a bounded share of each CR's ready pods
   (``cacheMetrics`` in the operator configuration: ``maxPodsPerResync``,
   ``maxConcurrentScrapes``, ``timeoutSeconds``) and keep each pod's samples of the last
   ``windowSeconds``;
2. :mod:`.scrape` -- one HTTP GET of ``http://<pod IP>:<engine port>/metrics``, time-limited
   and at most 4 MiB;
3. :mod:`.sglang_metrics` -- parse the page, reduce it per pod, aggregate pods and windows into
   hit ratios per tier, the host pool's use and whether L3 writes land (pure);
4. :mod:`.status_block` -- the new ``status.cache``: a figure is rewritten only when it moved
   by ``minRatioChange`` (pure). The controller writes it with the rest of the status and
   turns ``l3Writes: Failing`` into a ``StorageWritesFailing`` Event
   (``controller.transitions``).

What happens when a pod's ``/metrics`` is unreachable (refused or reset connection, timeout,
HTTP error, an oversized or unparsable page): :mod:`.scrape` raises ``ScrapeError``; the
observer counts it (``hicache_operator_cache_scrapes_total{result="error"}``), adds no sample
for that pod (its earlier samples stay in the window), counts only the pods it read in
``status.cache.pods`` and names the others; :mod:`.status_block` then sets
``status.cache.message`` to "could not read the SGLang metrics of pod(s) <names> (is
--enable-metrics on, and may the operator reach the engine port?)" and keeps every figure that
did not move. The reconcile goes on unchanged: no condition flips, nothing is retried before
the next resync, and the next scrape that reads every pod clears the message. A pod that is
gone, no longer ready or was replaced loses its history. Proved by
tests/operator/test_cachestats.py and tests/e2e/test_cache_status.py.

``scrape_cache_figures(urls)`` reads one or more pages the same way for a test against a real
server (the pod tier).
"""

from .scrape import ScrapeError, scrape_cache_figures
from .sglang_metrics import CacheFigures, PodCounters, figures_from_pages, parse_pod

__all__ = ["CacheFigures", "PodCounters", "ScrapeError", "figures_from_pages", "parse_pod",
           "scrape_cache_figures"]
