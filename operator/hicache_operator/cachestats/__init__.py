"""Cache figures of SGLang servers: pure parsing and aggregation (``sglang_metrics``) and the
HTTP scrape (``scrape``).

``scrape_cache_figures(urls)`` is the entry point for a test against a real server: it reads one
or more ``/metrics`` pages and returns the figures the operator writes into ``status.cache``
(``hit_ratio(tier)``, ``host_used_ratio``, ``l3_writes``).
"""

from .scrape import ScrapeError, scrape_cache_figures
from .sglang_metrics import CacheFigures, PodCounters, figures_from_pages, parse_pod

__all__ = ["CacheFigures", "PodCounters", "ScrapeError", "figures_from_pages", "parse_pod",
           "scrape_cache_figures"]
