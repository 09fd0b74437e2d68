"""experiments/forked_groups/summarize: each run's row from its evaluation, metrics and route_probs, each arm's mean."""
import json

import pytest

from experiments.forked_groups import summarize


def make_run(root, name, em, warm_minus_rl, p_best=None, val=(0.47, 0.40, 0.60), fmt=(1.0, 0.8), routes=None):
    run = root / name
    (run / "eval").mkdir(parents=True)
    (run / "ppo").mkdir()
    runs = [{"label": "SFT router", "overall": {"em": 0.537, "cost_usd": 3.3e-5},
             "vs_router": {"em_diff": warm_minus_rl, "em_diff_ci95": [warm_minus_rl - 0.07, warm_minus_rl + 0.07]}},
            {"label": f"PPO router ({name})", "overall": {"em": em, "cost_usd": 4.5e-6}}]
    (run / "eval" / "summary.json").write_text(json.dumps({"runs": runs}))
    if routes is not None:  # (label, domain, model) per routed hop, one trajectory each
        (run / "eval" / "trajectories.jsonl").write_text("".join(json.dumps(
            {"run": label, "turns": [{"action": "route", "model": m, "domain": d}, {"action": "answer"}]}) + "\n"
            for label, d, m in routes))
    rows = [{"step": 0, "val/em/mean": val[0]}, {"step": 1, "format_ok/mean": fmt[0]},
            {"step": 2, "format_ok/mean": fmt[1], "val/em/mean": val[1]}, {"step": 3, "val/em/mean": val[2]}]
    (run / "ppo" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if p_best is not None:
        (run / "route_probs.md").write_text(f"| x |\nP(best) over 413 hops of a known domain: {p_best:.2f} (...)\n")


def test_rows_means_and_records(tmp_path):
    rl = "PPO router (plain_s1)"
    routes = [(rl, "science", "Qwen2.5-7B-Instruct"), (rl, "people", "Mistral-7B-Instruct"),
              (rl, "science", "Mistral-7B-Instruct"), (rl, "geography", "Gemma-2-27B-Instruct"),
              ("SFT router", "science", "Qwen2.5-7B-Instruct")]  # the warm start's routes are not the run's
    make_run(tmp_path, "plain_s1", 0.573, -0.037, p_best=0.43, routes=routes)
    make_run(tmp_path, "plain_s2", 0.557, -0.020, p_best=0.41)
    make_run(tmp_path, "forked_dw10_s1", 0.580, -0.043)  # no route_probs.md: P(best) "-"
    (tmp_path / "plain_s3").mkdir()  # not evaluated: left out
    records = tmp_path / "records"
    assert summarize.main([str(tmp_path), "--records", str(records)]) == 0
    table = (records / "table.md").read_text().splitlines()
    # configs/pool/sim.yaml: Qwen2.5-7B knows science, Mistral-7B people, LLaMA-3.1-8B geography
    assert "| plain | 1 | 0.573 | +0.037 [-0.033, +0.107] | 4.50 | 0.50 | 0.43 | 0.47 / 0.40 / 0.60 | 0.80 |" in table
    assert "| forked_dw10 | 1 | 0.580 | +0.043 [-0.027, +0.113] | 4.50 | - | - | 0.47 / 0.40 / 0.60 | 0.80 |" in table
    mean = next(line for line in table if line.startswith("| **plain"))
    assert "mean of 2" in mean and "**0.565** (sd 0.011)" in mean and "| 0.50 | 0.42 |" in mean
    assert sorted(p.name for p in records.glob("*_route_probs.md")) == ["plain_s1_route_probs.md",
                                                                         "plain_s2_route_probs.md"]


def test_an_out_dir_without_runs_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no evaluated"):
        summarize.main([str(tmp_path)])
