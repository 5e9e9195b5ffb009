"""Host memory for KV pools: the allocator (hugepages, NUMA, parallel prefault) and the kernel
calls under it."""
