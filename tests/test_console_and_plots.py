"""What a user reads: one compact console line per step, a summary table, a Pareto plot labelled at any cost range."""
from pathlib import Path

import pytest

from router_r1.eval import report
from verl.trainer.tracking import Tracker, console_line, read_jsonl, summary_table

ROOT = Path(__file__).resolve().parents[1]
STEP = {"reward/mean": 0.41234, "reward/max": 1.0, "em/mean": 0.5, "format_ok/mean": 0.97, "cost_usd/mean": 4.2e-5,
        "route_count/mean": 1.25, "actor/reward_kl": 0.0031, "timing/tokens_per_s": 1234.5, "timing/step": 8.26,
        "actor/pg_loss": -0.02, "critic/vf_loss": 0.3, "timing/gen": 3.0}


def test_console_line_is_compact_and_skips_what_is_missing():
    line = console_line(STEP, 3, 40)
    assert line == ("step 3/40 | reward 0.412 em 0.500 format 0.97 cost 4.20e-05 calls 1.25 kl 3.10e-03 "
                    "tok/s 1234 step_s 8.3")
    assert console_line({"reward/mean": 0.5, "val/em/mean": 0.25}, 1) == "step 1 | reward 0.500 val_em 0.250"


def test_tracker_prints_one_line_and_writes_every_metric(tmp_path, capsys):
    t = Tracker(["console", "jsonl"], tmp_path)
    t.log(STEP, 1, 2)
    t.log({**STEP, "reward/mean": 0.6}, 2, 2)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and out[0].startswith("step 1/2 | reward 0.412") and "pg_loss" not in out[0]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert set(STEP) <= set(rows[0]) and rows[1]["reward/mean"] == 0.6
    table = summary_table(rows).splitlines()
    reward = next(line for line in table if line.startswith("reward")).split()
    assert reward[1:5] == ["0.412", "1", "0.600", "2"] and len(table) == 9  # header + the 8 train fields


def test_redirected_the_console_line_comes_every_n_steps(tmp_path, capsys):
    """Output to a file (capsys is not a terminal): the first, every 10th, validated and last steps only."""
    t = Tracker(["console"], tmp_path, console_every=10)
    for step in range(1, 26):
        t.log({**STEP, **({"val/em/mean": 0.5} if step == 13 else {})}, step, 25)
    out = capsys.readouterr().out.strip().splitlines()
    assert [line.split(" |")[0] for line in out] == [f"step {s}/25" for s in (1, 10, 13, 20, 25)]


def test_a_redirected_run_draws_no_progress_bar(tmp_path, monkeypatch, capfd):
    """The trainer's bar and transformers' weight bars are off when stderr is a file (a 276 KB log before)."""
    from test_checkpoint import config

    from verl.trainer.main_ppo import run

    monkeypatch.chdir(ROOT)
    run(config(tmp_path, "trainer.total_steps=4", "trainer.logger=[console]", "trainer.console_every=3",
               "trainer.export_hf=true", "trainer.save_freq=0", "trainer.val_before_train=false"))
    out, err = capfd.readouterr()
    assert "it/s]" not in err and "it/s]" not in out and "Writing model shards" not in err + out
    assert [line.split(" |")[0] for line in out.splitlines() if line.startswith("step ")] == ["step 1/4", "step 3/4",
                                                                                               "step 4/4"]


def run(label, points):
    sources = {src: {"n": 10, "cost_1e6_usd": c, "em": em} for src, (c, em) in points.items()}
    return {"label": label, "sources": sources, "overall": {"n": 20, "cost_1e6_usd": sum(c for c, _ in points.values()) / 2,
                                                            "em": 0.5}}


@pytest.mark.parametrize("costs", [(40.0, 46.0, 55.0), (0.0, 3.0, 300.0), (2.54, 6.41, 30.3, 57.65, 24.5),
                                   (0.3, 0.5), (31.8,), (0.0, 14.2, 56.0, 66.6)])
def test_pareto_cost_axis_has_several_plain_labels_inside_the_view(costs):
    fig = report.pareto_figure([run(f"r{i}", {"nq": (c, 0.3 + 0.1 * i), "hq": (c, 0.2)}) for i, c in enumerate(costs)])
    fig.canvas.draw()
    for ax in fig.axes[:3]:
        lo, hi = ax.get_xlim()
        assert lo <= min(costs) and max(costs) <= hi  # every point in view
        shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
        assert len(shown) >= 3, (costs, ax.get_title(), shown)
        # plain numbers (no "10^1" mathtext), increasing, and no two labels on top of each other
        values = [float(x.replace("\u2212", "-")) for x in shown]
        assert values == sorted(values), shown
        boxes = sorted(t.get_window_extent().x0 for t in ax.get_xticklabels() if t.get_text())
        ends = sorted(t.get_window_extent().x1 for t in ax.get_xticklabels() if t.get_text())
        assert all(e < b for e, b in zip(ends, boxes[1:])), (costs, shown)


def test_an_alpha_sweep_is_one_curve_labelled_by_alpha():
    """The runs of one conditioned checkpoint told several alphas (joined from one summary per alpha) are one line
    with one legend entry; other runs stay points."""
    sweep = [{**run(f"PPO router (cond) told a={a:g}", {"nq": (c, em)}), "kind": "router", "checkpoint": "cond/hf",
              "told_alpha": a} for a, c, em in ((0.9, 3.0, 0.5), (0.0, 9.0, 0.6), (0.3, 6.0, 0.55))]
    fixed = {**run("PPO router a=0.3 (fixed)", {"nq": (5.0, 0.5)}), "kind": "router", "checkpoint": "fixed/hf",
             "told_alpha": None}
    fig = report.pareto_figure([*sweep, fixed])
    ax = fig.axes[0]  # the nq panel
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "PPO router (cond) told each alpha"]
    assert list(line.get_xdata()) == [9.0, 6.0, 3.0]  # in order of alpha
    assert sorted(t.get_text() for t in ax.texts) == ["0", "0.3", "0.9"]
    assert ax.get_legend_handles_labels()[1] == ["PPO router (cond) told each alpha", "PPO router a=0.3 (fixed)",
                                                 report.FRONTIER_LABEL]


def test_routers_on_one_point_stay_apart_and_the_frontier_is_labelled():
    """An SFT and a PPO router at the same cost and EM: two markers, two labels at two offsets; the dashed
    frontier has a legend entry (both were one star and an unnamed line)."""
    sft = {**run("SFT router", {"nq": (5.0, 0.85)}), "kind": "router"}
    ppo = {**run("PPO router", {"nq": (5.0, 0.85)}), "kind": "router"}
    single = {**run("single:Mixtral-8x22B", {"nq": (50.0, 0.88)}), "kind": "single"}
    fig = report.pareto_figure([sft, ppo, single])
    ax = fig.axes[0]
    routers = {c.get_label(): c for c in ax.collections if c.get_label().endswith("router")}
    shapes = [tuple(map(tuple, c.get_paths()[0].vertices.round(3))) for c in routers.values()]
    assert list(routers) == ["SFT router", "PPO router"] and shapes[0] != shapes[1]
    labels = {t.get_text(): t.xyann for t in ax.texts}
    assert set(labels) == {"SFT router", "PPO router"} and labels["SFT router"] != labels["PPO router"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["SFT router", "PPO router", "single:Mixtral-8x22B", report.FRONTIER_LABEL]
    lone = report.pareto_figure([ppo, single])
    assert len(lone.axes[0].texts) == 0  # one router: its star is unambiguous, no label needed


def test_cost_ticks_cover_the_data_in_round_steps():
    assert report.cost_ticks([2.54, 6.41, 30.3, 57.65]) == [2, 5, 10, 20, 50]
    assert report.cost_ticks([0.0, 3.0, 300.0])[0] == 0.0
    assert report.cost_ticks([40.0, 55.0]) == [30, 50, 70]


def summary_run(label, kind="single", source="2wikimultihopqa", stages=None, vs=None):
    m = {"n": 3, "em": 0.5, "em_ci95": [0.1, 0.9], "f1": 0.5, "format_ok": 1.0, "cost_1e6_usd": 2.0, "cost_usd": 2e-6,
         "cost_reward": 0.5, "reward": 0.5, "calls": 1.0, "pool_calls": 3, "pool_failure_rate": 0.0,
         "pool_latency_p50_s": 0.1, "pool_latency_p95_s": 0.2, "model_share": {"LLaMA-3.1-70B-Instruct": 1.0},
         "routing_entropy_bits": 0.0, "stages": stages or {}}
    return {"label": label, "kind": kind, "sources": {source: m}, "overall": m, **({"vs_router": vs} if vs else {})}


def test_table_names_are_whole_and_columns_explained():
    stages = {"format_ok": 1.0, "copy_ok": 0.6, "expert_ok": 0.5, "expert_best": 0.25, "gold_in_info": 0.58,
              "em_given_gold": 0.75, "decomposed": float("nan")}
    vs = {"reference": "PPO router (embedded)", "n": 3, "em_diff": 0.2, "em_diff_ci95": [0.1, 0.3],
          "cost_diff_1e6": -5.0, "cost_diff_1e6_ci95": [-6.0, -4.0], "verdict": "dominates the router"}
    table = report.format_table([summary_run("PPO router a=0.6 (embedded_alpha06)", "router", stages=stages),
                                 summary_run("single:LLaMA-3.1-70B-Instruct", vs=vs)])
    assert "PPO router a=0.6 (embedded_alpha06) 2wikimultihopqa" in table  # neither cut
    assert "share of the questions in which the run called that model" in table and "LLaMA-3.1-70B" in table
    stage_line = next(x for x in table.splitlines() if x.startswith("PPO router") and "0.600" in x)
    assert stage_line.split()[-7:] == ["1.000", "0.600", "0.500", "0.250", "0.580", "0.750", "-"]
    paired = next(x for x in table.splitlines() if x.startswith("single:LLaMA") and "dominates" in x)
    assert "+0.200" in paired and "[+0.100, +0.300]" in paired and "[-6.00, -4.00]" in paired


def test_paired_comparison_against_the_router():
    ref = [{"uid": str(i), "em": float(i % 2), "cost_usd": 10e-6} for i in range(40)]
    better = [{"uid": str(i), "em": 1.0, "cost_usd": 2e-6} for i in range(40)]
    same = [dict(r) for r in ref]
    v = report.paired_vs(ref, better, "router")
    assert v["n"] == 40 and v["em_diff"] == pytest.approx(0.5) and v["cost_diff_1e6"] == pytest.approx(-8.0)
    assert v["em_diff_ci95"][0] > 0 and v["verdict"] == "dominates the router"
    assert report.paired_vs(ref, same, "router")["verdict"] == "EM within noise, cost within noise"
    worse = [{"uid": str(i), "em": 0.0, "cost_usd": 20e-6} for i in range(40)]
    assert report.paired_vs(ref, worse, "router")["verdict"] == "dominated by the router"
    assert report.paired_vs(ref, [{"uid": "x", "em": 1.0, "cost_usd": 0.0}], "router") is None


def test_report_prints_the_path_it_wrote(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.setattr(report, "format_table", lambda runs: "")  # the table is not what this test reads
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"runs": [run("a", {"nq": (40.0, 0.4)}), run("b", {"nq": (50.0, 0.5)})]}))
    for out, written in [(tmp_path / "plot", tmp_path / "plot.png"), (tmp_path, tmp_path / "pareto.png")]:
        assert report.main([str(summary), "--out", str(out)]) == 0 and written.is_file()
        assert capsys.readouterr().out.strip().endswith(f"wrote {written}")


def test_table_of_a_summary_read_back_with_nulls():
    """summary.json writes nan as null: a run that made no call has a null entropy and null stages."""
    r = summary_run("PPO router", "router", stages={"copy_ok": None, "format_ok": 0.0})
    r["overall"] = {**r["overall"], "routing_entropy_bits": None}
    share = next(x for x in report.format_table([r]).splitlines()[::-1] if x.startswith("PPO router"))
    assert share.split()[-1] == "-"
