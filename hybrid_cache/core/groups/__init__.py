"""hybrid_cache/groups package."""
