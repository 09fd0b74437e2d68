"""A pool model the router never saw (issue 31): configs/pool/sim_unseen.yaml's new science specialist, and
evaluation with and without --include-unseen reporting its share of the science calls, on a tiny setup."""
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim.qa import SimConfig, build_sim
from sim.embedded import compact_pool_text
from router_r1.eval.evaluate import EvalConfig, Policy, evaluate
from router_r1.pool.registry import ModelRegistry
from sim.truth import SimTruth
from sim.world import SimWorld
from verl.workers.rollout.base import GenOutput

REPO = Path(__file__).resolve().parents[1]
SIM, UNSEEN_POOL = REPO / "configs" / "pool" / "sim.yaml", REPO / "configs" / "pool" / "sim_unseen.yaml"
NEW = "SciGLM-6B"
SPECIALIST = {"science": "Qwen2.5-7B-Instruct", "business": "Qwen2.5-7B-Instruct", "geography": "LLaMA-3.1-8B-Instruct",
              "sports": "LLaMA-3.1-8B-Instruct", "people": "Mistral-7B-Instruct", "arts": "Mistral-7B-Instruct"}
TEMPLATE = "Route or answer.\n{budget}Models:\n{pool}\nQuestion: {question}\n"


def test_seen_models_are_sim_yaml_s():
    """Data, SFT and PPO built on either pool are the same: only the unseen model differs."""
    full = ModelRegistry.from_yaml(UNSEEN_POOL)
    assert [m.name for m in full.models.values() if m.unseen] == [NEW]
    assert list(full.seen().models.values()) == list(ModelRegistry.from_yaml(SIM).seen().models.values())


def test_the_unseen_model_is_the_best_value_on_science_and_says_so():
    full = ModelRegistry.from_yaml(UNSEEN_POOL)
    truth = SimTruth.from_registry(full)
    world = SimWorld(seed=0)
    for q in world.questions(60, seed=3, split="test", two_hop_frac=0.0):
        facts = truth.facts(q.question)
        want = NEW if facts[0].domain == "science" else SPECIALIST[facts[0].domain]
        assert truth.pick(facts) == want, q.question  # the cheapest expert that knows it
        assert truth.pick(facts, full.seen().names) == SPECIALIST[facts[0].domain]
    assert truth.strong_domains(NEW) == ["science"]
    assert "science" in full[NEW].descriptor and "cheapest" in full[NEW].descriptor
    assert f"{NEW} $0.05: science" in compact_pool_text(full).splitlines()


def test_the_validation_probe_is_another_new_model_on_another_domain():
    """sim_probe.yaml: the same six seen models, and GeoMind-3B the best value on geography; no bank name (plain or
    styled) is it, so no training row names it, and it is not the test's unseen model."""
    from sim.warm_start.pool_variation import name_bank
    from router_r1.pool.registry import normalize_name

    probe = ModelRegistry.from_yaml(REPO / "configs" / "pool" / "sim_probe.yaml")
    assert list(probe.seen().models.values()) == list(ModelRegistry.from_yaml(SIM).seen().models.values())
    assert [m.name for m in probe.models.values() if m.unseen] == ["GeoMind-3B"]
    truth = SimTruth.from_registry(probe)
    for q in SimWorld(seed=0).questions(60, seed=3, split="test", two_hop_frac=0.0):
        facts = truth.facts(q.question)
        want = "GeoMind-3B" if facts[0].domain == "geography" else SPECIALIST[facts[0].domain]
        assert truth.pick(facts) == want, q.question
    assert truth.strong_domains("GeoMind-3B") == ["geography"]
    assert "GeoMind-3B $0.04: geography" in compact_pool_text(probe).splitlines()
    banks = {normalize_name(n) for styled in (False, True) for n in name_bank(1000, styled=styled)}
    assert normalize_name("GeoMind-3B") not in banks and normalize_name(NEW) not in banks


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The same 30 one-hop test questions twice: prompts listing the seen models, and listing every model."""
    root = tmp_path_factory.mktemp("unseen")
    (root / "template.txt").write_text(TEMPLATE)
    for name, unseen in (("seen", False), ("all", True)):
        build_sim(SimConfig(out_dir=root / name, pool=UNSEEN_POOL, include_unseen=unseen,
                            prompt_template=root / "template.txt", train_size=1, val_size=1, test_size=30,
                            two_hop_frac=0.0))
    frame = pd.read_parquet(root / "all" / "test.parquet")
    return root, {r["extra_info"]["question"]: (r["extra_info"]["domain"], list(r["reward_model"]["ground_truth"]["target"]))
                  for r in frame.to_dict("records")}


def descriptor_reader(tok, questions):
    """Routes a question to its domain's seen specialist, or to SciGLM-6B for science when the prompt lists it;
    answers with the gold after one reply (EM is not what is measured here)."""
    def generate(prompts, sampling):
        outs = []
        for ids in prompts:
            text = tok.decode(ids)
            q = re.search(r"Question: (.*)\n", text).group(1)
            domain, golds = questions[q]
            model = NEW if domain == "science" and f"- {NEW} (" in text else SPECIALIST[domain]
            turn = (f"<think>done</think><answer>{golds[0]}</answer>" if "<information>" in text
                    else f"<think>ask</think><search>{model}: {q}</search>")
            outs.append(GenOutput(tok(turn, add_special_tokens=False)["input_ids"], "stop"))
        return outs
    return generate


def test_evaluation_with_and_without_the_unseen_model(tmp_path, tok, data):
    root, questions = data
    n_science = sum(d == "science" for d, _ in questions.values())
    assert 3 <= n_science < len(questions)
    summaries, logs = {}, []
    for name, unseen in (("seen", False), ("all", True)):
        cfg = EvalConfig(data=[str(root / name / "test.parquet")], sim=True, pool=str(UNSEEN_POOL),
                         include_unseen=unseen, checkpoints=["scripted"], out=str(tmp_path / name),
                         max_obs_length=200, response_length=64, max_response_length=1024, schedule="sync")
        policy = Policy(tok, descriptor_reader(tok, questions), template=TEMPLATE)
        summaries[name] = evaluate(cfg, load=lambda c: policy, log=logs.append)["runs"][0]
    seen, offered = summaries["seen"], summaries["all"]
    assert seen["unseen"] == {NEW: {"science": {"share": 0.0, "calls": n_science}}}
    assert offered["unseen"] == {NEW: {"science": {"share": 1.0, "calls": n_science}}}
    assert seen["overall"]["domain_call_share"]["science"]["share"]["Qwen2.5-7B-Instruct"] == 1.0
    assert offered["overall"]["domain_call_share"]["sports"]["share"]["LLaMA-3.1-8B-Instruct"] == 1.0
    assert f"scripted: unseen {NEW} got 1.00 of the {n_science} science calls" in logs
    assert sum(f"unseen {NEW} got" in line for line in logs) == 1  # none from the run that was not offered it
    on_disk = json.loads((tmp_path / "all" / "summary.json").read_text())["runs"][0]
    assert on_disk["unseen"][NEW]["science"]["share"] == 1.0
    # paired over the same questions: the same EM, cheaper where the new specialist answered
    proc = subprocess.run([sys.executable, "-m", "tools.analysis.paired_evals", str(tmp_path / "seen"),
                           str(tmp_path / "all"), "--out", str(tmp_path / "diff.json")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"unseen {NEW} on science: share of calls 0.00 -> 1.00 ({n_science} calls)" in proc.stdout
    diff = json.loads((tmp_path / "diff.json").read_text())["scripted"]["paired"]
    assert diff["n"] == len(questions) and diff["em_diff"] == 0.0
    assert diff["cost_diff_1e6"] < 0 and diff["cost_diff_1e6_ci95"][1] < 0
    # --routers pairs the one router run of each directory whatever their labels (fixed against conditioned)
    proc = subprocess.run([sys.executable, "-m", "tools.analysis.paired_evals", str(tmp_path / "seen"),
                           str(tmp_path / "all"), "--routers", "--out", str(tmp_path / "r.json")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["scripted"]["paired"] == diff
    # --cross pairs every run of B with every run of A, keyed "B vs A"
    proc = subprocess.run([sys.executable, "-m", "tools.analysis.paired_evals", str(tmp_path / "seen"),
                           str(tmp_path / "all"), "--cross", "--out", str(tmp_path / "x.json")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "x.json").read_text()).keys() == {"scripted vs scripted"}
    assert json.loads((tmp_path / "x.json").read_text())["scripted vs scripted"]["paired"] == diff
    # records kept gzipped (as in docs/results) read the same
    plain = tmp_path / "all" / "trajectories.jsonl"
    (tmp_path / "all" / "trajectories.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    proc = subprocess.run([sys.executable, "-m", "tools.analysis.paired_evals", str(tmp_path / "seen"),
                           str(tmp_path / "all"), "--out", str(tmp_path / "z.json")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "z.json").read_text())["scripted"]["paired"] == diff


def test_a_conditioned_router_is_offered_the_unseen_model_on_the_same_data(tmp_path, tok, data, monkeypatch):
    """An alpha-conditioned router's prompts are rebuilt from each question (with the alpha it is told) over the
    evaluation pool, so --include-unseen with a template listing the pool offers it SciGLM-6B on data built for the
    seen pool, and no prompt/pool warning is given (it does not read the rows' prompts)."""
    from router_r1.eval import evaluate as ev

    root, questions = data
    monkeypatch.setattr(ev, "conditioned_alpha", lambda checkpoint, cfg: 0.6)
    logs, seen_prompts = [], []
    reader = descriptor_reader(tok, questions)

    def generate(prompts, sampling):
        seen_prompts.extend(tok.decode(p) for p in prompts)
        return reader(prompts, sampling)

    cfg = EvalConfig(data=[str(root / "seen" / "test.parquet")], sim=True, pool=str(UNSEEN_POOL), include_unseen=True,
                     checkpoints=["scripted"], out=str(tmp_path / "cond"), max_obs_length=200, response_length=64,
                     max_response_length=1024, schedule="sync")
    (run,) = evaluate(cfg, load=lambda c: Policy(tok, generate, template=TEMPLATE), log=logs.append)["runs"]
    assert run["label"] == "scripted told a=0.6" and run["told_alpha"] == 0.6
    assert all("Cost weight for this question: 0.6 " in p and f"- {NEW} (" in p for p in seen_prompts)
    assert run["unseen"][NEW]["science"]["share"] == 1.0
    assert not any("appear in no prompt" in m for m in logs)
