"""curves.png says what it shows: how train and val were decoded, val EM's 95% interval over the val questions,
the best val step against the exported (last) step. Checked on the figure's artists, not its pixels."""
from pathlib import Path

import pytest

from verl.trainer.curves import curve_panels, curves_figure, decoding_labels, plot_curves, wilson
from verl.trainer.main_ppo import load_config

ROOT = Path(__file__).resolve().parents[1]
ROWS = ([{"step": 0, "val/em/mean": 0.79, "val/reward/mean": 0.74, "val/n": 100}]
        + [{"step": s, "em/mean": 0.2 + 0.01 * s, "reward/mean": 0.1, "actor/pg_loss": -0.01} for s in range(1, 31)]
        + [{"step": 10, "val/em/mean": 0.85, "val/reward/mean": 0.8, "val/n": 100},
           {"step": 20, "val/em/mean": 0.85, "val/reward/mean": 0.81, "val/n": 100},
           {"step": 30, "val/em/mean": 0.81, "val/reward/mean": 0.78, "val/n": 100}])
KEYS = ["reward/mean", "val/reward/mean", "em/mean", "val/em/mean", "actor/pg_loss"]
LABELS = {"train_label": "train: sampled at T 0.5", "val_label": "val: greedy"}


def legend_texts(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_wilson_interval():
    lo, hi = wilson(0.5, 100)
    assert (round(lo, 4), round(hi, 4)) == (0.4038, 0.5962)  # the textbook 50 of 100
    assert wilson(0.0, 10)[0] == 0.0 and wilson(1.0, 10)[1] <= 1.0


def test_a_metric_and_its_val_twin_share_a_panel():
    rows = [{"step": 1, "reward/mean": 0.1, "val/reward/mean": 0.2, "actor/pg_loss": 0.0, "val/nq/reward": 0.3}]
    assert curve_panels(["reward/mean", "val/reward/mean", "actor/pg_loss", "val/nq/reward", "never/logged"], rows) == [
        ("reward/mean", "val/reward/mean"), ("actor/pg_loss", None), (None, "val/nq/reward")]
    assert curve_panels(["val/reward/mean"], rows) == [(None, "val/reward/mean")]  # the twin only when asked for


def test_the_figure_says_how_each_curve_was_decoded_and_which_model_is_exported():
    fig = curves_figure(ROWS, KEYS, "embedded", **LABELS)
    texts = legend_texts(fig)
    assert texts == ["train: sampled at T 0.5", "val: greedy", "val 95% CI (Wilson, n=100)",
                     "best val 0.850 (step 10)", "exported: last step (30)"]
    title = fig._suptitle.get_text()
    assert title.startswith("embedded\ntrain: sampled at T 0.5 | val: greedy")
    assert "exported model is the last step's" in title
    em = next(ax for ax in fig.axes if ax.get_title() == "em/mean: train and val")
    band = next(c for c in em.collections if c.get_label().startswith("val 95% CI"))
    ys = band.get_paths()[0].vertices[:, 1]
    lo, hi = wilson(0.85, 100)
    assert ys.min() == pytest.approx(wilson(0.79, 100)[0]) and ys.max() == pytest.approx(hi) and lo > 0.75
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
        "reward/mean: train and val", "em/mean: train and val", "actor/pg_loss"]


def test_without_val_n_there_is_no_band_and_without_val_no_note(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "val/n"} for r in ROWS]
    assert not any("CI" in t for t in legend_texts(curves_figure(rows, KEYS, **LABELS)))
    fig = curves_figure(ROWS, ["actor/pg_loss"], "sft")
    assert fig._suptitle.get_text() == "sft" and legend_texts(fig) == []
    with pytest.raises(ValueError, match="none of the requested metrics"):
        plot_curves(write_rows(tmp_path, ROWS), ["never/logged"], tmp_path / "c.png")


def write_rows(tmp_path, rows) -> Path:
    import json

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_labels_follow_the_rollout_config(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert decoding_labels(load_config("embedded").rollout) == LABELS
    sampled = load_config("embedded", ["rollout.val_greedy=false", "rollout.val_temperature=0.5",
                                       "rollout.temperature=1.0"]).rollout
    assert decoding_labels(sampled) == {"train_label": "train: sampled at T 1", "val_label": "val: sampled at T 0.5"}


def test_the_trainer_draws_curves_with_its_decoding(tmp_path, monkeypatch):
    """A PPO run passes its rollout's labels to the plot (a plot without them cannot say why train < val)."""
    import verl.trainer.ppo_trainer as ppo_trainer
    from test_checkpoint import config

    from verl.trainer.main_ppo import run

    seen = {}
    real = ppo_trainer.plot_curves
    monkeypatch.setattr(ppo_trainer, "plot_curves", lambda *a, **kw: seen.update(kw) or real(*a, **kw))
    monkeypatch.chdir(ROOT)
    run(config(tmp_path, "trainer.total_steps=2", "trainer.logger=[jsonl]", "rollout.temperature=0.9",
               "trainer.export_hf=false", "trainer.save_freq=0"))
    assert seen["train_label"] == "train: sampled at T 0.9" and seen["val_label"] == "val: greedy"
    assert (tmp_path / "curves.png").stat().st_size > 0
