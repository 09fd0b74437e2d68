"""A run's resolved config is saved beside its models; evaluation and inference read their shape from it."""
from pathlib import Path

import pytest

from router_r1.eval.evaluate import EvalConfig, EvalError, plan_runs, with_training_shape
from verl.trainer.config import RUN_CONFIG, find_run_config, save_run_config
from verl.trainer.main_ppo import load_config


def trained(tmp_path, name, *overrides):
    """A checkpoint directory holding the run_config.yaml of configs/embedded.yaml with `overrides`."""
    cfg = load_config("embedded", overrides)
    save_run_config(cfg, tmp_path / name)
    return str(tmp_path / name)


def test_saved_config_is_resolved_and_found_from_a_step_actor_dir(tmp_path):
    ckpt = trained(tmp_path, "run/checkpoints/step_000002")
    text = (tmp_path / "run/checkpoints/step_000002" / RUN_CONFIG).read_text()
    assert "${" not in text and "response_length: 64" in text and "alpha: 0.0" in text
    assert find_run_config(f"{ckpt}/actor") == find_run_config(ckpt) == tmp_path / ckpt / RUN_CONFIG
    assert find_run_config(tmp_path) is None


def test_evaluation_takes_the_trained_shape_and_a_flag_overrides_it(tmp_path):
    ckpt = trained(tmp_path, "a", "env.max_turns=2", "env.alpha=0.6", "env.schedule=sync")
    cfg = with_training_shape(EvalConfig(data=["x"], checkpoints=[ckpt], max_obs_length=99), log=lambda m: None)
    assert (cfg.max_turns, cfg.max_obs_length, cfg.response_length, cfg.max_response_length, cfg.schedule,
            cfg.alpha) == (2, 99, 64, 512, "sync", 0.6)


def test_no_run_config_gets_the_paper_shape_and_sampling_gets_sync(tmp_path):
    cfg = with_training_shape(EvalConfig(data=["x"], checkpoints=[str(tmp_path)], temperature=1.0), log=lambda m: None)
    paper = load_config("router_r1").env
    assert (cfg.max_turns, cfg.max_obs_length, cfg.response_length, cfg.max_response_length) == (
        paper.max_turns, paper.max_obs_length, 1024, 4096)
    assert cfg.schedule == "sync"  # sampled runs reproduce under sync


def test_checkpoints_trained_differently_need_the_flag(tmp_path):
    a, b = trained(tmp_path, "a", "env.alpha=0.0"), trained(tmp_path, "b", "env.alpha=0.6")
    with pytest.raises(EvalError, match=r"different env\.alpha.*--alpha"):
        with_training_shape(EvalConfig(data=["x"], checkpoints=[a, b]), log=lambda m: None)
    assert with_training_shape(EvalConfig(data=["x"], checkpoints=[a, b], alpha=0.3), log=lambda m: None).alpha == 0.3


def test_evaluation_scores_with_the_trained_rule_set_and_gate(tmp_path):
    """A run trained with strict rules and the F1 gate is scored so in its evaluation, unless a flag says otherwise."""
    from router_r1.eval.evaluate import score
    from router_r1.pool.registry import ModelRegistry

    ckpt = trained(tmp_path, "a", "env.format_rules=strict", "env.reward_metric=f1")
    cfg = with_training_shape(EvalConfig(data=["x"], checkpoints=[ckpt]), log=lambda m: None)
    assert (cfg.format_rules, cfg.reward_metric) == ("strict", "f1")
    assert with_training_shape(EvalConfig(data=["x"], checkpoints=[ckpt], format_rules="reference"),
                               log=lambda m: None).format_rules == "reference"
    # Free text between blocks: the reference's rules accept it, strict ones do not; a partial answer
    # earns F1 credit under the f1 gate and nothing under em.
    text = "<think>go</think> so <answer>Paris France</answer>"
    registry = ModelRegistry.from_yaml(Path(__file__).resolve().parents[1] / "configs/pool/sim.yaml")
    rows = {}
    for rules, metric in (("reference", "em"), ("strict", "em"), ("reference", "f1")):
        records = [{"text": text, "golds": ["Paris"], "cost_usd": 0.0, "route_count": 0}]
        score(records, registry, 0.0, rules, metric)
        rows[rules, metric] = records[0]
    assert rows["reference", "em"]["format_ok"] and not rows["strict", "em"]["format_ok"]
    assert rows["reference", "em"]["reward"] == 0.0
    assert rows["reference", "f1"]["reward"] == pytest.approx(2 / 3)


def test_serving_and_calibration_score_with_the_trained_rules(tmp_path):
    from router_r1.serve_engine import load_run_settings

    ckpt = trained(tmp_path, "a", "env.format_rules=strict", "env.reward_metric=f1")
    env = load_run_settings(Path(ckpt)).env
    assert (env.format_rules, env.reward_metric) == ("strict", "f1")
    bare = load_run_settings(tmp_path / "none").env
    assert (bare.format_rules, bare.reward_metric) == ("reference", "em")


def test_checkpoints_carry_the_prompt_template_and_resume_names_changed_keys(tmp_path, monkeypatch, capsys):
    """data.prompt_template is written beside run_config.yaml into every checkpoint and the HF export (what
    replaying an episode needs); a resume names each key that differs from the checkpoint's saved config."""
    from hydra import compose, initialize_config_dir

    from verl.trainer.main_ppo import CONFIG_DIR, run

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    template = tmp_path / "t.txt"
    template.write_text("Route or answer.\n{pool}\nQuestion: {question}\n")

    def config(*overrides):
        with initialize_config_dir(CONFIG_DIR, version_base=None):
            return compose("ppo_trainer", overrides=[
                f"trainer.output_dir={tmp_path / 'run'}", "trainer.logger=[jsonl]", "trainer.test_freq=0",
                "trainer.val_before_train=false", "rollout.response_length=8", "trainer.save_freq=1",
                f"data.prompt_template={template}", *overrides])

    run(config("trainer.total_steps=1"))
    for d in ("run/checkpoints/step_000001", "run/hf", "run"):
        assert (tmp_path / d / "prompt_template.txt").read_text() == template.read_text(), d
    capsys.readouterr()
    run(config("trainer.total_steps=2", "actor.lr=3e-6", "trainer.resume_changed_ok=true"))
    out = capsys.readouterr().out
    assert "differs from the one step_000001 was saved with, in 3 key(s) (training settings among them" in out
    assert "actor.lr: 1e-06 -> 3e-06" in out and "trainer.total_steps: 1 -> 2" in out
    with pytest.raises(ValueError, match="data.prompt_template: cannot read"):
        save_run_config(config(f"data.prompt_template={tmp_path / 'missing.txt'}"), tmp_path / "x")


def test_a_conditioned_run_is_evaluated_at_its_first_alpha_unless_told(tmp_path):
    """Its env.alpha (the unconditioned reward's, 0 by default) is no alpha it was trained to be told."""
    ckpt = trained(tmp_path, "a", "env.alphas=[0.3,0.9]")
    assert with_training_shape(EvalConfig(data=["x"], checkpoints=[ckpt]), log=lambda m: None).alpha == 0.3
    assert with_training_shape(EvalConfig(data=["x"], checkpoints=[ckpt], alpha=0.9), log=lambda m: None).alpha == 0.9
    # its run is labelled with the alpha it was told, so the runs of a sweep stay apart in a joined report
    (run,) = plan_runs(with_training_shape(EvalConfig(data=["x"], checkpoints=[ckpt], alpha=0.9), log=lambda m: None), [])
    assert run.told_alpha == 0.9 and run.label.endswith(" told a=0.9")
    plain = trained(tmp_path, "b")
    (run,) = plan_runs(with_training_shape(EvalConfig(data=["x"], checkpoints=[plain]), log=lambda m: None), [])
    assert run.told_alpha is None and "told" not in run.label
