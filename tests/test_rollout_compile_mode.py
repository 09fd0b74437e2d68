"""rollout.compile_mode reaches torch.compile for hf_static's per-layer work, and a mode the engine cannot
use (one that captures CUDA graphs of its own, or a typo) is refused by name."""
import pytest
import torch

from tiny import tiny_model
from verl.trainer.main_ppo import load_config, rollout_config
from verl.workers.rollout import build_rollout


def test_the_config_carries_compile_mode_to_the_engine(tok, monkeypatch):
    cfg = load_config("ppo_trainer", ["rollout.name=hf_static", "rollout.compile=true",
                                      "rollout.compile_mode=max-autotune-no-cudagraphs"])
    modes = []
    real = torch.compile

    def recording_compile(fn, **kwargs):
        modes.append(kwargs.get("mode"))
        return real(fn, **kwargs)

    monkeypatch.setattr(torch, "compile", recording_compile)
    rc = rollout_config(cfg)
    assert rc["compile_mode"] == "max-autotune-no-cudagraphs"
    build_rollout(rc, tiny_model(len(tok), seed=1), tok)
    assert modes and set(modes) == {"max-autotune-no-cudagraphs"}  # every compiled function, no default among them


def test_a_mode_with_its_own_cudagraphs_is_refused(tok):
    with pytest.raises(ValueError, match="rollout.compile_mode"):
        build_rollout({"name": "hf_static", "compile": True, "compile_mode": "reduce-overhead"},
                      tiny_model(len(tok), seed=1), tok)
