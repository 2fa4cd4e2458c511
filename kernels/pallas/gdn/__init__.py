"""Gated DeltaNet kernels: fp32 oracle, chunked XLA form, Pallas GPU kernels, public API."""
