"""SGLang's storage page hash, built and loaded before the engine serves.

SGLang 0.5.23 hashes the pages of a storage prefetch (``HiCacheController._storage_hit_query``
-> ``mem_cache.utils.get_storage_hash_str`` -> ``cpp_utils.native_hash``) with a C++ extension,
``hicache_hash_cpp``, that it JIT-compiles with ``torch.utils.cpp_extension`` on first use: in
the prefetch thread of the first request, while that request waits under the prefetch timeout
(policy ``timeout``: 1 s + 0.25 s per 1,024 tokens). The radix tree hashes its backups
natively, so L3 writes never need the extension, and nothing builds it before a prefetch does.

Measured in the pod tier (tests/pod/test_restart_pod.py, a key trace of every store call): the
build took 13-15 s on the 2-core test machine. The first engine started it with its first
request; when the engine was killed before it finished (SGLang SIGKILLs its schedulers on
shutdown), the build directory held a 0-byte ``hash_binding.o``, no ``.so`` and torch's
``lock``; the restarted engine removed the stale lock and built from scratch inside the first
request's prefetch, which timed out after 1.41 s without one ``batch_exists``: 0 storage hits,
although every page was in the sidecar. When the first build happened to finish in time, the
restarted engine only loaded it and hit. In a real pod every container restart starts from a
fresh writable layer, so with the build under ``$HOME`` every restart rebuilt it.

:func:`warm_page_hash` builds (under SGLang's own build lock) and loads the extension in each
scheduler, and hashes one page with it, when the scheduler builds its host pool: before the
engine reports ready, so no prefetch waits for it. The launcher puts ``TORCH_EXTENSIONS_DIR`` on
the pod's run volume (an emptyDir, which outlives container restarts), so a restarted engine
loads the build in well under a second instead of compiling it again.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)

#: The environment variable torch's JIT extension builds read their directory from (the
#: launcher sets it: :func:`hicache_umbp.launch.command.extensions_env`).
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"

_lock = threading.Lock()
_ready_s: float | None = None


class PageHashUnavailableError(RuntimeError):
    """SGLang's page-hash extension cannot be built or loaded here."""


def warm_page_hash(page_size: int = 16) -> float:
    """Build (if needed) and load SGLang's page-hash extension in this process and hash one
    page with it; the seconds that took (0 after the first call). Raises
    :class:`PageHashUnavailableError` naming what is missing: without it, every storage prefetch
    of this engine fails."""
    global _ready_s
    with _lock:
        if _ready_s is not None:
            return 0.0
        t0 = time.monotonic()
        try:
            from sglang.srt.mem_cache.utils import get_hash_str

            got = get_hash_str(list(range(page_size)), None, page_size=page_size)
        except Exception as e:
            raise PageHashUnavailableError(
                "SGLang's HiCache page-hash extension (hicache_hash_cpp) could not be built or "
                f"loaded: {e!r} (cause: {e.__cause__!r}); it needs g++, ninja and the OpenSSL "
                f"headers in the image and a writable {EXTENSIONS_ENV} "
                f"({os.environ.get(EXTENSIONS_ENV, '~/.cache/torch_extensions')}); without it "
                "no request can be served from the L3 tier"
            ) from e
        if not (isinstance(got, list) and len(got) == 1 and isinstance(got[0], str)
                and len(got[0]) == 64):
            raise PageHashUnavailableError(
                f"SGLang's page hash of one {page_size}-token page returned {got!r}, not one "
                "64-hex digest: re-verify sglang.srt.mem_cache.utils.get_hash_str")
        _ready_s = time.monotonic() - t0
    log.info("hicache_umbp: SGLang's page-hash extension is loaded (%.2f s; %s=%s)", _ready_s,
             EXTENSIONS_ENV, os.environ.get(EXTENSIONS_ENV, "<torch default>"))
    return _ready_s


def ready_seconds() -> float | None:
    """What the first :func:`warm_page_hash` of this process took (None: not called yet)."""
    return _ready_s
