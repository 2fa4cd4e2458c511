"""`python -m hybrid_cache.explain`: what vLLM 0.33 hits on a model and a trace, and why not more.

`explain.py` has the rule (arms, reasons, recoveries); `__main__.py` the command line.
"""

from hybrid_cache.explain.explain import REASONS
from hybrid_cache.explain.explain import TraceArgs
from hybrid_cache.explain.explain import explain
from hybrid_cache.explain.explain import table
from hybrid_cache.explain.explain import write

__all__ = ["REASONS", "TraceArgs", "explain", "table", "write"]
