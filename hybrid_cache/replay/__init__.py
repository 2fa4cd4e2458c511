"""Scenario replay: drive a cache manager from a JSON scenario and compare with its expectations.

`python -m hybrid_cache.replay FILES... --check` (see `replay.main`); `scenario` parses files.
"""
