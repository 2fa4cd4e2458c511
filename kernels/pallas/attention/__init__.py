"""Paged attention (full and sliding-window) over block tables, ragged prefill + decode."""
