"""SGLang HiCache L3 backend over AMD MORI's UMBP, its host allocator and the in-pod launcher.

The parts, each a sub-package, lower ones never importing higher ones (``make lint`` checks it):

* ``contract``: the env contract the operator shares (settings, parsing, units, names, paths,
  the sizes and formulas both sides compute with); standard library only;
* ``store``: the page store over any UMBP client (keys, page checks, batching, DRAM in front of
  SSD, write-back ring); ``clients``: mori's clients and the guards around them; ``hostmem``:
  host memory for KV pools (hugepages, NUMA, prefault);
* ``build``: the composition root that wires one rank's store from the configuration;
* ``launch``: the in-pod launcher (``python -m hicache_umbp.launch``);
* ``sglang``: the SGLang integration (adapter, host-allocator hook), the only part that imports
  torch or sglang.

``serve``, ``sglang_adapter`` and ``sglang_hook`` are the public names a pod, SGLang and the
engine image load (:mod:`hicache_umbp.contract.names`); docs/architecture.md draws the layers.
"""

__version__ = "0.1.0"
