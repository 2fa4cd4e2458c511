"""hybrid-cache models: small Flax NNX hybrid decoders with explicit paged caches."""
