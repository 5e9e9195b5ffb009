"""The kopf controller: handlers (thin), the API module (``kube``), reconcile, status, metrics.

Run it with ``python -m hicache_operator.controller`` (or ``python -m hicache_operator run``).
"""
