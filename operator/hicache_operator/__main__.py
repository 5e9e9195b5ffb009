"""``python -m hicache_operator``: see :mod:`hicache_operator.cli`."""

from .cli import main

raise SystemExit(main())
