"""The SSD tier of our own: pages in preallocated slot files, one per drive, read and written
with ``O_DIRECT`` ``preadv``/``pwritev`` straight between the host pool and the disk.

Why not mori 1.2.4's SSD node (still selectable, ``umbp_ssd_engine=mori``): it stages every read
in slots that only a 200 ms reaper frees (ROCm/mori#601), so it reads at a fraction of the disk;
it needs io_uring, which containerd's RuntimeDefault seccomp refuses; and it discards its segment
files at start, so a restart throws the tier away. See docs/architecture.md, "The SSD tier".

Layout (one room of the backend; it imports only :mod:`hicache_umbp.contract` and the store's
client protocol):

* :mod:`.layout`: the on-disk format (superblock, index entries) and the store identity;
* :mod:`.index`: one drive's slot index, a memory-mapped file shared by the pod's ranks (all
  processes), set-associative, LRU within a set, commit records and a generation per slot so a
  torn or overwritten page is never served;
* :mod:`.drive`: one drive: its data file, its index, its I/O thread pool;
* :mod:`.store`: :class:`DiskStore`, the UMBP client over the drives (pages striped by key).
"""

from .store import DiskStats, DiskStore

__all__ = ["DiskStats", "DiskStore"]
