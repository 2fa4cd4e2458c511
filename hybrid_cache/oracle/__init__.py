"""Pure, obviously-correct helper rules of the plain-Python reference (vLLM 0.33 semantics)."""
