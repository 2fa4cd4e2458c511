# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Simulator policies: hit rate and TTFT vs capacity
#
# Every simulator policy (Marconi-compat V1 / V2 / static alpha, vLLM+, and the cache-core
# policies `vllm_align`, `vllm_align_marconi`, `vllm_all`, `lru`) on three traces (Mooncake
# conversation, Mooncake synthetic, seeded synthetic chat) across capacities, against the
# infinite-cache oracle. The same code as `python -m experiments.ablate_capacity`.
#
# Run: `jupytext --to notebook experiments/notebooks/sim_policies.py` and open it, or run it
# as a script (`python experiments/notebooks/sim_policies.py`). The parameters cell below
# sets the sizes; the test `tests/experiments/sim_policies_notebook_test.py` runs it tiny.

# %% tags=["parameters"]
LIMIT = 1000  # requests per trace
CHAT_SESSIONS = 60
TRACES = ("conversation", "synthetic", "chat")
CAPACITIES = {
  "conversation": (1e10, 2e10, 4e10, 8e10),
  "synthetic": (1e10, 2e10, 4e10, 8e10),
  "chat": (2e9, 5e9, 1e10, 2e10),
}
POLICIES = (
  "marconi_compat_sglang",
  "marconi_compat",
  "marconi_compat_static:1",
  "marconi_compat_vllm",
  "vllm_align",
  "vllm_align_marconi",
  "vllm_all",
  "lru",
)
BLOCK_SIZE = None  # core policies; None = per trace (512 for Mooncake, 128 for chat)
BACKEND = "reference"  # core policies: "reference" (ReferencePolicy) or "jax"
OUT_DIR = "results/sim_policies"

# %%
import os

from experiments.ablate_capacity import load_traces
from experiments.ablate_capacity import plot
from experiments.ablate_capacity import run_ablation

os.makedirs(OUT_DIR, exist_ok=True)
traces = load_traces(TRACES, LIMIT, CHAT_SESSIONS)
for name, tr in traces.items():
  print(f"{name}: {len(tr)} requests, {tr.input_tokens} input tokens")

# %%
records = run_ablation(
  traces,
  {t: CAPACITIES[t] for t in TRACES},
  POLICIES,
  block_size=BLOCK_SIZE,
  backend=BACKEND,
  log=lambda s: None,
)
paths = plot(records, OUT_DIR)
print(paths)

# %% [markdown]
# ## Fraction of the oracle per policy and capacity

# %%
rows = [r for r in records if "skipped" not in r and r["policy"] != "oracle"]
print(f"{'trace':13s} {'policy':24s} {'cap GB':>7s} {'hit':>7s} {'of oracle':>9s} {'p95 ms':>7s}")
for r in rows:
  print(
    f"{r['trace']:13s} {r['policy']:24s} {r['capacity_bytes'] / 1e9:7.0f} "
    f"{r['token_hit_rate']:7.4f} {r['fraction_of_oracle']:9.3f} {r['ttft_p95_ms']:7.0f}"
  )
skipped = [r for r in records if "skipped" in r]
print(f"{len(skipped)} (policy, capacity) points skipped: capacity below the longest request")

# %% [markdown]
# ## FLOP-aware vs LRU eviction (Marconi-compat)
#
# Marconi's FLOP-aware eviction (static alpha = 1, and V2's tuned alpha) against LRU over the
# same admission (SGLang+ = V1), per trace and capacity: ratio of token hit rates (> 1: the
# FLOP-aware policy reuses more). The core's own `flop_aware` eviction is not wired here until
# the core implements `eviction="flop_aware"`.


# %%
def _hit(trace, policy, cap):
  for r in rows:
    if (r["trace"], r["policy"], r["capacity_bytes"]) == (trace, policy, cap):
      return r["token_hit_rate"]
  return None


flop_vs_lru = []
for t in TRACES:
  for cap in CAPACITIES[t]:
    lru_hit = _hit(t, "marconi_compat_sglang", cap)
    for pol in ("marconi_compat_static:1", "marconi_compat"):
      h = _hit(t, pol, cap)
      if lru_hit and h is not None:
        flop_vs_lru.append((t, cap, pol, h / lru_hit))
        print(f"{t:13s} {cap / 1e9:5.0f} GB {pol:24s} x{h / lru_hit:.3f} vs LRU")
