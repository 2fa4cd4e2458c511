"""Batched in-place state-slot copies (SSM/GDN recurrent and conv state pools)."""
