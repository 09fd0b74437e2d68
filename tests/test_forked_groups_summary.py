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
    assert ("| plain | 1 | 0.573 | +0.037 [-0.033, +0.107] | 4.50 | 0.50 | 0.43 | 0.47 / 0.40 / 0.60 | 0.80 "
            "| - |") in table
    assert "| forked_dw10 | 1 | 0.580 | +0.043 [-0.027, +0.113] | 4.50 | - | - | 0.47 / 0.40 / 0.60 | 0.80 | - |" \
        in table
    mean = next(line for line in table if line.startswith("| **plain"))
    assert "mean of 2" in mean and "**0.565** (sd 0.011)" in mean and "| 0.50 | 0.42 |" in mean
    assert sorted(p.name for p in records.glob("*_route_probs.md")) == ["plain_s1_route_probs.md",
                                                                         "plain_s2_route_probs.md"]


def test_an_out_dir_without_runs_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no evaluated"):
        summarize.main([str(tmp_path)])


def shares(step, **by_model):
    return {"step": step, **{f"routing/all/share/{m}/mean": x for m, x in by_model.items()}}


def test_a_name_the_sampled_routes_stop_naming_is_dropped():
    # A named at steps 0-4, then 25 steps at 0: dropped from step 5; B silent for only the last 10: not yet;
    # C never named at all (a warm start that never routes to it): not dropped either
    rows = [shares(s, A=0.3 if s < 5 else 0.0, B=0.2 if s < 20 else 0.0, C=0.0) for s in range(30)]
    rows.insert(3, {"step": 3, "val/em/mean": 0.5})  # a validation row between training steps is skipped
    assert summarize.dropped_names(rows) == {"A": 5}
    assert summarize.dropped_names(rows, window=10) == {"A": 5, "B": 20}
    assert summarize.dropped_names([{"step": 0, "val/em/mean": 0.4}]) is None  # no shares logged: unknown


def test_the_table_names_a_dropped_model_and_counts_the_runs(tmp_path):
    make_run(tmp_path, "mb16_s1", 0.80, -0.37)
    make_run(tmp_path, "mb16_s3", 0.68, -0.25)
    make_run(tmp_path, "mb16_s4", 0.80, -0.37)
    for seed, gone in ((1, None), (3, "LLaMA-3.1-8B-Instruct"), (4, "Mixtral-8x22B-Instruct")):
        rows = [shares(s, **{"Mistral-7B-Instruct": 0.5, "LLaMA-3.1-8B-Instruct": 0.2, "Mixtral-8x22B-Instruct": 0.1,
                             **({gone: 0.0} if gone and s >= 222 else {})}) for s in range(1, 260)]
        (tmp_path / f"mb16_s{seed}" / "ppo" / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
    assert summarize.main([str(tmp_path), "--records", str(tmp_path / "r")]) == 0
    table = (tmp_path / "r" / "table.md").read_text().splitlines()
    assert next(t for t in table if t.startswith("| mb16 | 1 |")).endswith("| none |")
    # configs/pool/sim.yaml: LLaMA-3.1-8B is geography's best model, Mixtral-8x22B no domain's
    assert next(t for t in table if t.startswith("| mb16 | 3 |")).endswith("| LLaMA-3.1-8B-Instruct* (222) |")
    assert next(t for t in table if t.startswith("| mb16 | 4 |")).endswith("| Mixtral-8x22B-Instruct (222) |")
    assert next(t for t in table if t.startswith("| **mb16")).endswith("| 1 of 3 dropped a best model |")
