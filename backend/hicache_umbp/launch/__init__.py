"""The in-pod launcher: probe the node, check hugepages and SSD, then exec SGLang.

Run as ``python -m hicache_umbp.launch [--dry-run] [--node-root DIR]``; see docs/launcher.md.
:mod:`.run` is the launch sequence; :mod:`.command` renders the SGLang command line from the env
contract and is all the operator imports from here (this package imports nothing itself, so
importing the command never loads the node probes).
"""
