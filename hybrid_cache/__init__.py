"""hybrid-cache: prefix caching for hybrid LLMs in JAX."""

__version__ = "0.1.0"
