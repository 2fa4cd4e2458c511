"""Trace builders (generators + seeds are committed, not the large token files)."""
