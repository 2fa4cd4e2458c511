"""Mamba2 (SSD) scan: token oracle, chunked XLA form, Pallas GPU kernels; public API in api.py."""
