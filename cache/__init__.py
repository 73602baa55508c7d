"""Content addressing and the tiered audio store (memory, disk, Redis) with single flight."""
