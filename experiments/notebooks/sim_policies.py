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
# # Simulator policies: hit rate and TTFT vs capacity, against the oracle bound
#
# Every simulator policy (Marconi-compat V1 / V2 / static alpha, vLLM+, and the cache-core
# profiles `align_dense_no_junction`, `vllm_align_dense`, `vllm_default` (vLLM 0.33's serving
# default), `all_dense_no_junction`, `flop_aware`; `hybrid_cache.profiles`) on four traces
# (Mooncake conversation, Mooncake synthetic, seeded synthetic chat, real ShareGPT conversations
# when the optional extra `sharegpt` is installed) across capacities, against the
# infinite-cache oracle (dashed). Core policies replay through the jitted scan
# (`hybrid_cache/sim/core_scan.py`, backend "jax"). Same code as
# `python -m experiments.ablate_capacity`.
#
# Run: `jupytext --to notebook experiments/notebooks/sim_policies.py` and open it, or run it
# as a script (`python experiments/notebooks/sim_policies.py`). The parameters cell below
# sets the sizes; the test `tests/experiments/sim_policies_notebook_test.py` runs it tiny.

# %% tags=["parameters"]
LIMIT = 1000  # requests per trace
CHAT_SESSIONS = 60
SHAREGPT_SESSIONS = 100
TRACES = ("conversation", "synthetic", "chat", "sharegpt")
CAPACITIES = {
  "conversation": (1e10, 2e10, 4e10, 8e10),
  "synthetic": (1e10, 2e10, 4e10, 8e10),
  "chat": (2e9, 5e9, 1e10, 2e10),
  "sharegpt": (1e9, 2e9, 5e9, 1e10),
}
POLICIES = (
  "marconi_compat_sglang",
  "marconi_compat",
  "marconi_compat_static:1",
  "marconi_compat_vllm",
  "align_dense_no_junction",
  "vllm_align_dense",
  "vllm_default",
  "all_dense_no_junction",
  "flop_aware",
)
BLOCK_SIZE = None  # core policies; None = per trace (512 for Mooncake, 128 for chat, 64 else)
BACKEND = "jax"  # core policies: "jax" (scan), "jax_protocol" or "reference"
OUT_DIR = "results/sim_policies"

# %%
import os

from experiments.ablate_capacity import load_traces
from experiments.ablate_capacity import plot
from experiments.ablate_capacity import run_ablation
from hybrid_cache import persistent_cache

persistent_cache.enable()
os.makedirs(OUT_DIR, exist_ok=True)
traces = load_traces([t for t in TRACES if t != "sharegpt"], LIMIT, CHAT_SESSIONS)
if "sharegpt" in TRACES:
  try:
    from hybrid_cache.sim.sharegpt import load_sharegpt

    sg = load_sharegpt(num_sessions=SHAREGPT_SESSIONS)
    traces["sharegpt"] = sg.head(LIMIT) if LIMIT else sg
  except ImportError as e:  # optional extra absent: three traces remain
    print(f"sharegpt skipped: {e}")
for name, tr in traces.items():
  print(f"{name}: {len(tr)} requests, {tr.input_tokens} input tokens")

# %%
records = run_ablation(
  traces,
  {t: CAPACITIES[t] for t in traces},
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


# %%
def plot_fraction(records, out_dir):
  """fraction_of_oracle_vs_capacity.png: each policy's hit rate / the oracle's, per trace."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = list(dict.fromkeys(r["trace"] for r in records))
  fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
  for ax, t in zip(axes[0], names):
    sel = [r for r in records if r["trace"] == t and "skipped" not in r and r["policy"] != "oracle"]
    for pol in dict.fromkeys(r["policy"] for r in sel):
      pts = sorted(
        (r["capacity_bytes"], r["fraction_of_oracle"]) for r in sel if r["policy"] == pol
      )
      ax.plot([p[0] / 1e9 for p in pts], [p[1] for p in pts], marker="o", label=pol)
    ax.axhline(1.0, color="k", linestyle="--", label="oracle (infinite cache)")
    ax.set_xscale("log")
    ax.set_xlabel("capacity (GB)")
    ax.set_ylabel("fraction of the oracle's reused tokens")
    ax.set_title(t)
  axes[0][-1].legend(fontsize=7)
  fig.tight_layout()
  path = os.path.join(out_dir, "fraction_of_oracle_vs_capacity.png")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


print(plot_fraction(records, OUT_DIR))

# %% [markdown]
# ## FLOP-aware vs LRU eviction
#
# Ratio of token hit rates (> 1: the FLOP-aware policy reuses more) over the same admission:
# the cache core's `flop_aware` (static alpha 1, block pool) against `vllm_default` (LRU), and
# Marconi-compat static alpha = 1 (V3) and tuned alpha (V2) against LRU leaves (V1). Contention
# per point: the oracle's reused tokens over what the policy keeps (1 - fraction of oracle of
# LRU); "moderate" means LRU keeps between 20% and 80% of the oracle.


# %%
def _hit(trace, policy, cap):
  for r in rows:
    if (r["trace"], r["policy"], r["capacity_bytes"]) == (trace, policy, cap):
      return r["token_hit_rate"], r["fraction_of_oracle"]
  return None


flop_vs_lru = []
for t in traces:
  for cap in CAPACITIES[t]:
    for base, pol in (
      ("vllm_default", "flop_aware"),
      ("marconi_compat_sglang", "marconi_compat_static:1"),
      ("marconi_compat_sglang", "marconi_compat"),
    ):
      b, h = _hit(t, base, cap), _hit(t, pol, cap)
      if b and h and b[0] > 0:
        moderate = 0.2 <= b[1] <= 0.8
        flop_vs_lru.append((t, cap, pol, h[0] / b[0], moderate))
        print(
          f"{t:13s} {cap / 1e9:5.0f} GB {pol:24s} x{h[0] / b[0]:.3f} vs {base}"
          f" (LRU keeps {b[1]:.2f} of the oracle{', moderate' if moderate else ''})"
        )
