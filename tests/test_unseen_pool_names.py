"""Your own pool (issue 44, item 4): the prompt lists the pool in use, and infer.py, the server and evaluation say at
start which of its models the router was never trained to name, refusing (unless --allow-unseen-models) where it was
trained to name none; a checkpoint whose template has the training models written in still loads, with a warning."""
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

import infer
from router_r1.eval.evaluate import EvalConfig, evaluate
from router_r1.pool.registry import ModelRegistry
from router_r1.runtime import EvalError, Policy, open_pool
from router_r1.router_env import RouterEnvConfig
from router_r1.trained_names import check_trained_names
from sim.embedded import COMPACT_TEMPLATE, render_compact_template
from sim.qa import SimConfig, build_sim
from tiny import tiny_model
from verl.workers.rollout.base import GenOutput, SamplingParams

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "configs" / "pool" / "sim.yaml"
OWN = ["Acme-Chat-8B", "Borealis-70B"]  # names no training row writes
PLACEHOLDER_TEMPLATE = COMPACT_TEMPLATE.read_text()  # keeps {pool_domains}


def own_pool(tmp_path: Path) -> Path:
    """Two models of new names, simulated (world: sim) so that they answer in-process as endpoints would."""
    doc = yaml.safe_load(SIM.read_text())
    doc["models"] = [dict(m, name=n, aliases=[], card=f"{n}, instruction-tuned general assistant")
                     for m, n in zip(doc["models"][:2], OWN)]
    path = tmp_path / "own_pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def checkpoint(tmp_path: Path, tok, template: str = PLACEHOLDER_TEMPLATE, env: dict | None = None,
               data: dict | None = None) -> Path:
    """A tiny model dir whose run_config.yaml says it trained on configs/pool/sim.yaml (or `env`, `data`)."""
    d = tmp_path / "ckpt"
    d.mkdir()
    tok.save_pretrained(d)
    tiny_model(len(tok)).save_pretrained(d)
    (d / "prompt_template.txt").write_text(template)
    env = {"factory": RouterEnvConfig.factory, "pool": "configs/pool/sim.yaml", "response_length": 16,
           "max_response_length": 64} if env is None else env
    (d / "run_config.yaml").write_text(yaml.safe_dump({"env": env, "data": data or {}}))
    return d


def test_a_pool_of_only_unseen_names_is_refused_naming_them_and_the_flag(tmp_path, tok):
    ckpt, pool = checkpoint(tmp_path, tok), ModelRegistry.from_yaml(own_pool(tmp_path))
    with pytest.raises(EvalError) as e:
        check_trained_names(ckpt, pool)
    assert all(n in str(e.value) for n in OWN) and "--allow-unseen-models" in str(e.value)
    assert "Qwen2.5-7B-Instruct" in str(e.value)  # what it was trained to name
    logged = []
    check_trained_names([ckpt], pool, allow_unseen=True, log=logged.append)
    assert len(logged) == 1 and logged[0].startswith("WARNING") and all(n in logged[0] for n in OWN)


def test_a_pool_with_some_unseen_models_names_those_only(tmp_path, tok):
    ckpt = checkpoint(tmp_path, tok)
    logged = []
    check_trained_names(ckpt, ModelRegistry.from_yaml(SIM), log=logged.append)  # the two unseen ones offered
    assert len(logged) == 1 and "Palmyra-Creative-122B, LLaMA3-ChatQA-1.5-8B of pool" in logged[0]
    logged.clear()
    check_trained_names(ckpt, ModelRegistry.from_yaml(SIM).seen(), log=logged.append)
    assert logged == []  # the pool it trained on: nothing to say


def test_a_warm_start_knows_the_models_its_rows_route_to(tmp_path, tok):
    rows = tmp_path / "oracle.parquet"
    pd.DataFrame({"route_models": [["Qwen2.5-7B-Instruct"], ["Mistral-7B-Instruct", "Qwen2.5-7B-Instruct"]]}).to_parquet(rows)
    ckpt = checkpoint(tmp_path, tok, env={}, data={"sft_files": [str(rows)]})
    logged = []
    check_trained_names(ckpt, ModelRegistry.from_yaml(SIM).seen(), log=logged.append)
    assert len(logged) == 1 and "never trained to name LLaMA-3.1-8B-Instruct, LLaMA-3.1-70B-Instruct, " \
        "Mixtral-8x22B-Instruct, Gemma-2-27B-Instruct of pool" in logged[0]


def test_an_old_template_with_the_models_written_in_loads_with_a_warning(tmp_path, tok):
    """A checkpoint from before the placeholder: its prompt lists the training models whatever the pool."""
    fixed = render_compact_template(ModelRegistry.from_yaml(SIM).seen())
    ckpt = checkpoint(tmp_path, tok, template=fixed)
    logged = []
    check_trained_names(ckpt, ModelRegistry.from_yaml(SIM).seen(), log=logged.append)
    assert len(logged) == 1 and "has no pool placeholder: it lists the models written into it" in logged[0]
    assert "never shows" not in logged[0]
    with open_pool(own_pool(tmp_path), sim=True) as pool:
        assert "Qwen2.5-7B-Instruct $0.30" in prompt_of(ckpt, pool, tok)  # still loads, and lists what it did


def prompt_of(ckpt: Path, pool, tok) -> str:
    """The prompt infer.py's episode gives the router for a question, decoded."""
    seen = []

    def generate(prompts, sampling):
        seen.append(tok.decode(prompts[0]))
        return [GenOutput(tok("<think>x</think><answer>y</answer>", add_special_tokens=False)["input_ids"], "stop")]
    rcfg = RouterEnvConfig(max_turns=1, max_obs_length=50, response_length=16, max_response_length=64,
                           schedule="sync")
    policy = Policy(tok, generate, template=(ckpt / "prompt_template.txt").read_text())
    infer.run_question("Who founded Festar Labs?", policy, pool, rcfg, SamplingParams(greedy=True, temperature=0.0))
    return seen[0]


def test_infer_lists_the_pool_in_use_and_refuses_one_it_cannot_route_to(tmp_path, tok, capsys):
    ckpt, pool_yaml = checkpoint(tmp_path, tok), own_pool(tmp_path)
    with open_pool(pool_yaml, sim=True) as pool:
        prompt = prompt_of(ckpt, pool, tok)
    assert "Acme-Chat-8B $0.30: science, business" in prompt and "Qwen2.5" not in prompt
    args = ["--question", "Who founded Festar Labs?", "--checkpoint", str(ckpt), "--pool", str(pool_yaml), "--sim",
            "--sim-latency", "0", "--max-turns", "1", "--response-length", "4", "--device", "cpu"]
    assert infer.main(args) == 2
    err = capsys.readouterr().err
    assert re.search(r"never trained to name Acme-Chat-8B, Borealis-70B .*--allow-unseen-models", err), err
    assert infer.main([*args, "--allow-unseen-models"]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "going on (--allow-unseen-models)" in err


def test_the_server_and_evaluation_refuse_at_start(tmp_path, tok):
    from router_r1.serve import parse_args, serving

    ckpt, pool_yaml = checkpoint(tmp_path, tok), own_pool(tmp_path)
    with pytest.raises(EvalError, match="never trained to name Acme-Chat-8B, Borealis-70B"):
        with serving(parse_args(["--checkpoint", str(ckpt), "--pool", str(pool_yaml), "--sim", "--device", "cpu"])):
            pass
    build_sim(SimConfig(out_dir=tmp_path / "data", pool=pool_yaml, prompt_template=ckpt / "prompt_template.txt",
                        train_size=1, val_size=1, test_size=2))
    cfg = EvalConfig(data=[str(tmp_path / "data" / "test.parquet")], pool=str(pool_yaml), sim=True,
                     checkpoints=[str(ckpt)], out=str(tmp_path / "eval"))
    loaded = []
    with pytest.raises(EvalError, match="never trained to name Acme-Chat-8B, Borealis-70B"):
        evaluate(cfg, load=loaded.append, log=lambda msg: None)
    assert loaded == []  # refused before any model loads
