"""hybrid-cache kernels: pure-JAX references and Pallas kernels, one folder per op."""
