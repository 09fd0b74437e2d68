"""configs/gramma.yaml composes, and its env section builds a GraphEnv through the trainer's loader."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from gramma.graph_env import GraphEnv
from tiny import tiny_tokenizer
from verl.trainer.env_interface import load_env
from verl.trainer.main_ppo import CONFIG_DIR, uses

KG = Path(__file__).resolve().parent / "data" / "kg"


def load(*overrides):
    with initialize_config_dir(CONFIG_DIR, version_base=None):
        return compose("gramma", overrides=list(overrides))


def test_config_composes_and_builds_the_env():
    c = load(f"env.graph_dir={KG}", "env.rank.top_k=5", "env.evidence_weight=0.3", "rollout.response_length=40")
    assert c.env.factory == "gramma.graph_env:make_env" and uses(c) == (True, True)
    env = load_env(c.env.factory, c.env, tiny_tokenizer())
    assert isinstance(env, GraphEnv)
    assert env.cfg.rank.top_k == 5 and env.cfg.evidence_weight == 0.3 and env.cfg.response_length == 40
    assert env.cfg.max_response_length == c.rollout.max_response_length and len(env.graph.entities) > 10
    assert env.state_dict() == {}


@pytest.mark.parametrize("override, needle", [("env.graph_dir=''", "env.graph_dir must name"),
                                              ("+env.rank.bogus=1", "env.rank.bogus: Key 'bogus' not in 'RankConfig'"),
                                              ("env.answer_metric=bleu", "answer_metric must be em|f1")])
def test_bad_env_settings_are_named(override, needle):
    c = load(f"env.graph_dir={KG}", override)
    with pytest.raises(ValueError, match=needle):
        load_env(c.env.factory, c.env, tiny_tokenizer())


def test_null_graph_dir_fails_at_composition():
    with pytest.raises(ConfigCompositionException, match="graph_dir"):
        load("env.graph_dir=null")


def test_grpo_override_drops_the_critic():
    c = load("algorithm.adv_estimator=grpo", "rollout.n=4")
    assert uses(c) == (False, True) and OmegaConf.select(c, "env.max_turns") == 6
