"""The CLI's default core backend is the scan: summary fields and dump, in process."""

import json

from hybrid_cache.sim import cli


def test_core_policy_through_the_scan(tmp_path, capsys):
  p = tmp_path / "t.jsonl"
  shared = list(range(1, 33))
  rows = [{"input_tokens": shared + [100 + i] * 5, "output_tokens": [7, 8, 9]} for i in range(4)]
  p.write_text("".join(json.dumps(r) + "\n" for r in rows))
  dump = tmp_path / "d.json"
  argv = ["--trace", str(p), "--format", "marconi", "--model", "marconi_7b"]
  argv += ["--capacity-bytes", "1e12", "--policy", "all_dense_no_junction", "--block-size", "8"]
  argv += ["--dump", str(dump)]
  assert cli.main(argv) == 0
  s = json.loads(capsys.readouterr().out)
  assert s["backend"] == "jax_scan" and s["requests"] == 4 and s["steps"] >= 4
  # all_dense_no_junction keeps a state at every block boundary: requests 1-3 reuse the 32
  # shared tokens
  assert json.loads(dump.read_text()) == [[0, 37, 0]] + [[1, 37, 32]] * 3
  assert s["fraction_of_oracle"] == 1.0
  assert s.get("states_admitted", 1) > 0
  # --progress: a bar on stderr, the same summary on stdout
  assert cli.main(argv + ["--progress"]) == 0
  out = capsys.readouterr()
  timing = ("replay_s", "replay_cpu_s", "prepare_s", "wall_s", "requests_per_s")
  with_bar = json.loads(out.out)
  assert {k: v for k, v in with_bar.items() if k not in timing} == {
    k: v for k, v in s.items() if k not in timing
  }
  assert "replay all_dense_no_junction" in out.err and "4/4" in out.err


def test_bad_alpha_is_a_clean_error(tmp_path, capsys):
  p = tmp_path / "t.jsonl"
  p.write_text(json.dumps({"input_tokens": [1, 2, 3], "output_tokens": [4]}) + "\n")
  argv = ["--trace", str(p), "--format", "marconi", "--model", "marconi_7b"]
  argv += ["--capacity-bytes", "1e12", "--policy", "flop_aware", "--block-size", "8"]
  for bad in ("abc", "-1", "101"):
    assert cli.main(argv + ["--alpha", bad]) == 2
    assert "alpha must be 'tuned' or a number in [0, 100]" in capsys.readouterr().err
  assert cli.main(argv + ["--alpha", "tuned", "--backend", "reference"]) == 2
  assert "alpha 'tuned' needs backend 'jax'" in capsys.readouterr().err
