"""The page store over any UMBP client: keys, page checks, batching, DRAM-in-front-of-SSD tiers
and their write-back ring. Imports neither mori, torch nor sglang."""
