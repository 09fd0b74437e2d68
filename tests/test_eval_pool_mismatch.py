"""Evaluation warns when the data's prompts list models that the evaluation pool does not have."""
from pathlib import Path

import yaml
from tiny import tiny_tokenizer

from data_process.sim_qa import SimConfig, build_sim
from router_r1.eval.evaluate import EvalConfig, Policy, evaluate, load_rows, prompt_pool_mismatch
from router_r1.pool.registry import ModelRegistry
from verl.workers.rollout.base import GenOutput

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"


def _answer_at_once(tok):
    def generate(prompts, sampling):
        return [GenOutput(tok("<think>x</think><answer>Paris</answer>", add_special_tokens=False)["input_ids"], "stop")
                for _ in prompts]
    return generate


def test_a_pool_other_than_the_data_s_is_warned_about(tmp_path):
    build_sim(SimConfig(out_dir=tmp_path / "data", train_size=1, val_size=1, test_size=2))  # prompts list sim.yaml
    test_file = tmp_path / "data" / "test.parquet"
    doc = yaml.safe_load(SIM.read_text())
    doc["models"] = doc["models"][:2]
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(doc))
    kept = [m["name"] for m in doc["models"]]
    gone = [n for n in ModelRegistry.from_yaml(SIM).seen().names if n not in kept]

    tok = tiny_tokenizer()
    for pool, warned in ((two, True), (SIM, False)):
        logged = []
        cfg = EvalConfig(data=[str(test_file)], pool=str(pool), sim=True, checkpoints=["c"],
                         out=str(tmp_path / pool.stem), response_length=16, max_response_length=64)
        evaluate(cfg, load=lambda c: Policy(tok, _answer_at_once(tok)), log=logged.append)
        warnings = [m for m in logged if m.startswith("WARNING: the data was built for another pool")]
        assert bool(warnings) == warned, logged
        if warned:
            assert all(n in warnings[0] for n in gone) and not any(f"list {n}" in warnings[0] for n in kept)
            assert f"{test_file} row 0" in warnings[0]

    rows = load_rows([test_file])
    bigger = ModelRegistry.from_yaml(SIM)  # the unseen models too: offered, but no prompt lists them
    assert "appear in no prompt" in prompt_pool_mismatch(rows, bigger)
