"""Plain-Python twins of the registered policies (`hybrid_cache.policies`), one file per policy."""
