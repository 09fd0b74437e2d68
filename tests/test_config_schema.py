"""The typed run config: every field documented, unknown or mistyped keys fail at start naming them."""
import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from gramma.graph_env import GraphEnvConfig
from router_r1.router_env import RouterEnvConfig, make_env
from verl.trainer.config import PPOConfig, check_env_config, field_docs, section_to_dataclass
from verl.trainer.main_ppo import CONFIG_DIR
from verl.trainer.single_turn import SingleTurnEnvConfig
from verl.workers.config import WorkerConfig


def sections(cls, seen=None):
    """cls and every dataclass nested in its fields."""
    seen = seen if seen is not None else []
    if cls not in seen:
        seen.append(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                sections(type(default), seen)
    return seen


ALL = sections(PPOConfig) + sections(RouterEnvConfig) + sections(GraphEnvConfig) + [SingleTurnEnvConfig,
                                                                                       WorkerConfig]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_field_is_documented(cls):
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if len(docs.get(f.name, "")) < 3]
    assert not missing, f"{cls.__name__}: fields without a doc comment beside them: {missing}"


def test_field_docs_reads_the_comment():
    assert field_docs(RouterEnvConfig)["alpha"].startswith("cost_coe")


def _compose(name, *overrides):
    with initialize_config_dir(CONFIG_DIR, version_base=None):
        return compose(name, overrides=list(overrides))


@pytest.mark.parametrize("override", ["actor.lrr=1e-5", "trainer.total_step=3", "algorithm.kl_ctrl.kl_cof=0.1"])
def test_unknown_engine_key_fails_naming_it(override):
    with pytest.raises(ConfigCompositionException) as e:
        _compose("ppo_trainer", override)
    assert override.split("=")[0].split(".")[-1] in str(e.value.__cause__ or e.value)


def test_mistyped_value_fails():
    with pytest.raises(ConfigCompositionException) as e:
        _compose("ppo_trainer", "actor.lr=fast")
    assert "lr" in str(e.value.__cause__ or e.value)


@pytest.mark.parametrize("override", ["env.alhpa=0.5", "env.max_turns=three"])
def test_unknown_env_key_fails_at_start_naming_it(override):
    with pytest.raises(ConfigCompositionException) as e:
        _compose("embedded", override)
    assert override.split("=")[0].split(".")[-1] in str(e.value.__cause__ or e.value)


def test_force_added_env_key_fails_at_start_naming_it():
    cfg = _compose("embedded", "+env.alhpa=0.5")  # hydra lets + add a key; the run's start refuses it
    with pytest.raises(ValueError, match=r"env\.alhpa.*RouterEnvConfig"):
        check_env_config(cfg)


def test_env_factory_swapped_on_the_command_line_is_checked_against_its_own_class():
    cfg = _compose("ppo_trainer", "env.factory=router_r1.router_env:make_env")  # single_turn's keys, router's factory
    with pytest.raises(ValueError, match=r"env\.reward_fn.*RouterEnvConfig"):
        check_env_config(cfg)


def test_env_section_is_typed_with_its_defaults():
    cfg = check_env_config(_compose("embedded"))
    env = section_to_dataclass(RouterEnvConfig, cfg.env, "env")
    assert env.max_turns == 3 and env.alpha == RouterEnvConfig.alpha
    assert env.response_length == cfg.rollout.response_length  # linked to the rollout, resolved
    assert _compose("gramma").env.factory == "gramma.graph_env:make_env"
    assert _compose("ppo_trainer", "env=router").env.factory == "router_r1.router_env:make_env"


def test_make_env_rejects_a_bad_mapping():
    with pytest.raises(ValueError, match=r"env\.max_turn\b"):
        make_env({"pool": "configs/pool/sim.yaml", "max_turn": 2, "response_length": 8,
                  "max_response_length": 64}, tokenizer=None)
