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


@pytest.mark.parametrize("costs", [(40.0, 46.0, 55.0), (0.0, 3.0, 300.0)])
def test_pareto_cost_axis_has_labels_inside_the_data(costs):
    fig = report.pareto_figure([run(f"r{i}", {"nq": (c, 0.3 + 0.1 * i), "hq": (c, 0.2)}) for i, c in enumerate(costs)])
    fig.canvas.draw()
    for ax in fig.axes[:3]:
        lo, hi = ax.get_xlim()
        shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
        assert len(shown) >= 2, (costs, ax.get_title(), shown)


def test_report_prints_the_path_it_wrote(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.setattr(report, "format_table", lambda runs: "")  # the table is not what this test reads
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"runs": [run("a", {"nq": (40.0, 0.4)}), run("b", {"nq": (50.0, 0.5)})]}))
    for out, written in [(tmp_path / "plot", tmp_path / "plot.png"), (tmp_path, tmp_path / "pareto.png")]:
        assert report.main([str(summary), "--out", str(out)]) == 0 and written.is_file()
        assert capsys.readouterr().out.strip().endswith(f"wrote {written}")
