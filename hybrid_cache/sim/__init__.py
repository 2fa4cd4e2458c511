"""hybrid_cache/sim package."""
