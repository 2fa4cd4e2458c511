"""Causal depthwise conv1d with conv state: references, Pallas GPU kernels; public API in api.py."""
