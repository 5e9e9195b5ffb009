"""At most one log line per failure kind per interval, with a count of what was suppressed.

The data path runs thousands of batches a second; a broken tier must not flood the log (and the
logging itself must not slow the path), yet the first failure of each kind must be seen at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimitedLog:
    """``warn(kind, msg)`` logs the first ``kind`` failure, then at most one per ``interval_s``.

    Suppressed occurrences are counted and reported on the next line of the same kind. The clock
    is injectable so tests count lines without sleeping.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def warn(self, kind: str, msg: str, *args: object) -> None:
        now = self._clock()
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            last = self._last.get(kind)
            if last is not None and now - last < self._interval_s:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            self._logger.warning(
                "[%s] " + msg + " (%d more since the last report)", kind, *args, suppressed
            )
        else:
            self._logger.warning("[%s] " + msg, kind, *args)
