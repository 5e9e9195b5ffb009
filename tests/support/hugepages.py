"""Reserve hugepages for a test or benchmark and give them back afterwards.

Root can grow the kernel's hugepage pool (``/sys/kernel/mm/hugepages/hugepages-<size>kB/
nr_hugepages``) on these machines; no hugetlb cgroup limits it. The pool is machine-wide and
other jobs may use it at the same time, so a reservation *adds* its pages to whatever is there
and, on exit (also after a failure), takes back exactly the pages it added: the count returns to
its previous value unless someone else changed it meanwhile, whose pages are left alone.

:class:`HugepagesRefused` says why the machine would not (not root, no such page size, memory
too fragmented to find the pages): tests skip with that reason.
"""

from __future__ import annotations

import os
from types import TracebackType

SYSFS = "/sys/kernel/mm/hugepages"


class HugepagesRefused(RuntimeError):
    """The machine would not reserve the hugepages (the message says why)."""


class HugepageReservation:
    """``with HugepageReservation(pages, page_kib) as r:`` -- ``r.free()`` hugepages free."""

    def __init__(self, pages: int, page_kib: int = 2048) -> None:
        self.pages = pages
        self.page_kib = page_kib
        self.dir = f"{SYSFS}/hugepages-{page_kib}kB"
        self.added = 0

    def _read(self, name: str) -> int:
        with open(f"{self.dir}/{name}") as f:
            return int(f.read())

    def _write_total(self, value: int) -> None:
        with open(f"{self.dir}/nr_hugepages", "w") as f:
            f.write(str(max(0, value)))

    def free(self) -> int:
        return self._read("free_hugepages")

    def __enter__(self) -> HugepageReservation:
        if not os.path.isdir(self.dir):
            raise HugepagesRefused(f"this kernel has no {self.page_kib} KiB hugepages ({self.dir})")
        if not os.access(f"{self.dir}/nr_hugepages", os.W_OK):
            raise HugepagesRefused(f"{self.dir}/nr_hugepages is not writable (needs root)")
        before = self._read("nr_hugepages")
        try:
            self._write_total(before + self.pages)
        except OSError as e:
            raise HugepagesRefused(f"the kernel refused to grow the hugepage pool: {e}") from e
        self.added = self._read("nr_hugepages") - before
        if self.added < self.pages:
            self.__exit__(None, None, None)
            raise HugepagesRefused(
                f"asked for {self.pages} more {self.page_kib} KiB hugepages, the kernel found "
                f"{max(self.added, 0)} (memory too fragmented or too little free)"
            )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.added > 0:
            self._write_total(self._read("nr_hugepages") - self.added)
            self.added = 0
