"""Per-kind KV cache group rules: full attention, sliding window, recurrent (vLLM §2)."""
