"""Process entry: ``python -m hicache_umbp.serve <sglang server args>``.

Exactly ``python -m sglang.launch_server <args>`` (same argument parsing, same server), with the
UMBP host-allocator hook (:mod:`hicache_umbp.sglang.hook`) installed first.

The hook is installed at *import time* of this module, not in :func:`main`, on purpose: SGLang
0.5.23 starts its scheduler, detokenizer and DP-controller processes with ``multiprocessing``
spawn, and a spawned child re-imports the parent's main module by name (as ``__mp_main__``, which
runs this module's top level but not the ``__main__`` block) before it unpickles and runs its
target. So every SGLang process below this entry, at any depth, installs the hook before it can
build a host KV pool, without a ``.pth`` file, ``sitecustomize`` or a patched SGLang.

The in-pod launcher (``python -m hicache_umbp.launch``) execs this module.
"""

from __future__ import annotations

import os
import sys

from hicache_umbp.sglang import hook as sglang_hook

sglang_hook.install()


def main(argv: list[str] | None = None) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(list(sys.argv[1:] if argv is None else argv))
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
