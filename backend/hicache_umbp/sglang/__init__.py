"""The SGLang integration: the storage adapter, the host-allocator hook and what they read from
SGLang's host pools. The only sub-package that imports torch or sglang (on import of its modules,
not of this package)."""
