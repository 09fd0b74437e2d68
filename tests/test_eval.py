"""The evaluator (test.sh) and its baselines against the real simulated pool server.

Metrics are checked exactly with scripted policies whose outputs are known; a tiny random
checkpoint checks the mechanics end to end (its format is mostly broken, by design).
"""
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from router_r1.eval.baselines import reply_answer
from router_r1.eval.evaluate import (EvalConfig, EvalError, Policy, evaluate, find_data_files, load_policy,
                                     load_rows)
from router_r1.eval.evaluate import main as evaluate_main
from router_r1.eval import report
from router_r1.eval.report import bootstrap_ci, pareto_front
from router_r1.pool.registry import ModelRegistry
from sim.backend import SimBackend
from router_r1.pool.messages import submodel_messages
from router_r1.reward.qa_em import em_score
from sim_split import TEMPLATE, sim_test_split, tiny_checkpoint
from verl.workers.rollout.base import GenOutput

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "configs" / "pool" / "sim.yaml"
BIG, CHEAP = "Mixtral-8x22B-Instruct", "LLaMA-3.1-8B-Instruct"
NO_CONSULT = "you may not consult any model"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = sim_test_split(tmp_path_factory.mktemp("data"), test_size=6, two_hop_frac=0.5)
    truth = {r["extra_info"]["question"]: (list(r["reward_model"]["ground_truth"]["target"]), r["data_source"])
             for r in pd.read_parquet(path).to_dict("records")}
    assert {s for _, s in truth.values()} == {"sim_1hop", "sim_2hop"}
    return path, truth


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tok):
    return [tiny_checkpoint(tmp_path_factory.mktemp(f"ckpt{seed}"), tok, seed) for seed in (0, 1)]


def backend():
    return SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)


def reply_of(model: str, question: str) -> tuple[str, float]:
    """What the sim pool answers `model` for the whole question, and the call's cost (computed here)."""
    spec = ModelRegistry.from_yaml(SIM)[model]
    text, _, completion = backend().respond(spec.api_id, submodel_messages(question), spec.max_tokens)
    return text, completion * spec.price_out_per_m / 1e6


class Scripted:
    """A policy with known turns: route the whole question to `route_to`, then answer by `answer(q)`.

    With route_to=None it answers at once. Records every call's batch size, sampling and prompt text.
    """

    def __init__(self, tok, answer, route_to=BIG):
        self.tok, self.answer, self.route_to = tok, answer, route_to
        self.sizes, self.samplings, self.prompts = [], [], []

    def __call__(self, prompts, sampling):
        self.sizes.append(len(prompts))
        self.samplings.append(sampling)
        outs = []
        for ids in prompts:
            text = self.tok.decode(ids)
            self.prompts.append(text)
            q = re.search(r"Question: (.*)\n", text).group(1)
            if self.route_to and "<information>" not in text:
                turn = f"<think>ask</think><search>{self.route_to}: {q}</search>"
            else:
                turn = f"<think>done</think><answer>{self.answer(q)}</answer>"
            outs.append(GenOutput(self.tok(turn, add_special_tokens=False)["input_ids"], "stop"))
        return outs


def run_eval(tmp_path, test_file, policy=None, **kw):
    kw.setdefault("schedule", "sync")  # the batch sizes the tests count are the sync schedule's
    cfg = EvalConfig(data=[str(test_file)], sim=True, out=str(tmp_path / "out"), max_obs_length=200,
                     response_length=64, max_response_length=1024, **kw)
    return evaluate(cfg, load=lambda c: policy, log=lambda msg: None)


def rcost(costs):
    """R_cost against the run's own window: 5th/95th percentiles of sqrt cost (the documented rule)."""
    roots = np.sqrt(np.asarray(costs))
    lo, hi = np.percentile(roots, [5, 95])
    return [1.0 if r == 0 else 1.0 - min(max((r - lo) / (hi - lo), 0.0), 1.0) for r in roots]


def test_scripted_router_metrics_are_exact(tmp_path, tok, data):
    test_file, truth = data
    # Right on one-hop questions, wrong on two-hop ones, whatever the pool says.
    policy = Scripted(tok, answer=lambda q: truth[q][0][0] if truth[q][1] == "sim_1hop" else "nobody")
    alpha = 0.5
    summary = run_eval(tmp_path, test_file, Policy(tok, policy), checkpoints=["scripted"], alpha=alpha,
                       batch_size=4)
    (run,) = summary["runs"]
    records = [json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == len(truth) == run["overall"]["n"]

    costs = {q: reply_of(BIG, q)[1] for q in truth}
    expected_rc = dict(zip([r["question"] for r in records], rcost([costs[r["question"]] for r in records])))
    for r in records:
        golds, source = truth[r["question"]]
        assert r["data_source"] == source and r["format_ok"] and r["route_count"] == 1
        assert r["cost_usd"] == pytest.approx(costs[r["question"]], rel=1e-12)
        assert r["cost_reward"] == pytest.approx(expected_rc[r["question"]])
        assert r["models_called"] == [BIG]
        right = source == "sim_1hop"
        assert r["em"] == r["f1"] == float(right)
        assert r["reward"] == pytest.approx((1 - alpha) + alpha * r["cost_reward"] if right else 0.0)

    for source, m in run["sources"].items():
        qs = [q for q in truth if truth[q][1] == source]
        assert m["n"] == len(qs)
        assert m["em"] == m["f1"] == float(source == "sim_1hop")
        assert m["em_ci95"] == [m["em"], m["em"]]  # a constant sample has no spread
        assert m["format_ok"] == 1.0 and m["calls"] == 1.0
        assert m["cost_usd"] == pytest.approx(np.mean([costs[q] for q in qs]), rel=1e-12)
        assert m["cost_1e6_usd"] == pytest.approx(m["cost_usd"] * 1e6)
        assert m["model_share"][BIG] == 1.0 and m["model_share"][CHEAP] == 0.0
    overall = run["overall"]
    n1 = sum(s == "sim_1hop" for _, s in truth.values())
    assert overall["em"] == pytest.approx(n1 / len(truth))
    assert overall["em_ci95"][0] < overall["em"] < overall["em_ci95"][1]
    assert overall["em_macro"] == pytest.approx(0.5)
    assert policy.sizes[:2] == [4, 4] and sum(policy.sizes) == 2 * len(truth)  # two turns per question
    assert all(s.is_greedy for s in policy.samplings)  # greedy is the default, and honoured
    assert (tmp_path / "out" / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["runs"][0]["overall"]["em"] == overall["em"] and on_disk["config"]["alpha"] == alpha


def test_baselines_are_paired_with_the_router_and_stages_reported(tmp_path, tok, data):
    test_file, truth = data
    policy = Scripted(tok, answer=lambda q: truth[q][0][0] if truth[q][1] == "sim_1hop" else "nobody")
    summary = run_eval(tmp_path, test_file, Policy(tok, policy), checkpoints=["scripted"],
                       baselines=[f"single:{BIG}"], batch_size=4)
    router, single = summary["runs"]
    records = [json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    em = {(r["run"], r["uid"]): r["em"] for r in records}
    diffs = [em[(single["label"], u)] - em[("scripted", u)] for (run, u) in em if run == "scripted"]
    vs = single["vs_router"]
    assert "vs_router" not in router and vs["reference"] == "scripted" and vs["n"] == len(truth)
    assert vs["em_diff"] == pytest.approx(np.mean(diffs)) and vs["em_diff_ci95"][0] <= vs["em_diff"]
    # both ask Mixtral the whole question: the same calls, the same cost
    assert vs["cost_diff_1e6"] == pytest.approx(0.0, abs=1e-9)
    st = router["overall"]["stages"]
    assert st["copy_ok"] == 1.0 and st["expert_ok"] == 1.0 and st["decomposed"] == 0.0
    assert st["format_ok"] == 1.0


def test_a_set_smaller_than_the_batch_is_evaluated_whole(tmp_path, tok, data):
    test_file, truth = data
    texts = {}
    for batch_size in (64, 2):
        policy = Scripted(tok, answer=lambda q: truth[q][0][0])
        summary = run_eval(tmp_path / str(batch_size), test_file, Policy(tok, policy), checkpoints=["s"],
                           batch_size=batch_size)
        assert summary["runs"][0]["overall"]["n"] == len(truth)
        assert policy.sizes[0] == min(batch_size, len(truth))
        out = tmp_path / str(batch_size) / "out" / "trajectories.jsonl"
        texts[batch_size] = {json.loads(x)["uid"]: json.loads(x)["text"] for x in out.read_text().splitlines()}
    assert texts[64] == texts[2]  # batching changes nothing


def test_sampling_is_seeded_and_honoured(tmp_path, tok, data):
    test_file, truth = data
    seeds = {}
    for seed in (3, 3, 4):
        policy = Scripted(tok, answer=lambda q: "x")
        run_eval(tmp_path / "s", test_file, Policy(tok, policy), checkpoints=["s"],
                 temperature=0.7, seed=seed, batch_size=2)
        assert all(not s.is_greedy and s.temperature == 0.7 for s in policy.samplings)
        seeds.setdefault(seed, []).append([s.seed for s in policy.samplings])
    assert seeds[3][0] == seeds[3][1]  # reproducible
    assert len(set(seeds[3][0])) == len(seeds[3][0])  # a fresh seed per generate call
    assert seeds[3][0] != seeds[4][0]


def test_tiny_checkpoint_greedy_repeats_and_sampling_follows_the_seed(tmp_path, data, checkpoints):
    test_file, _ = data
    policy = load_policy(checkpoints[0], "cpu")  # the real HF rollout behind it

    def texts(**kw):
        cfg = EvalConfig(data=[str(test_file)], checkpoints=["tiny"], sim=True, limit=1, max_turns=1,
                         response_length=6, out=str(tmp_path / "o"), **kw)
        evaluate(cfg, load=lambda c: policy, log=lambda msg: None)
        return [json.loads(x)["text"] for x in (tmp_path / "o" / "trajectories.jsonl").read_text().splitlines()]

    assert texts() == texts()
    assert texts(temperature=1.0, seed=0) == texts(temperature=1.0, seed=0)
    assert texts(temperature=1.0, seed=0) != texts(temperature=1.0, seed=1)


def test_rollout_backends_give_the_same_greedy_episodes(tmp_path, data, checkpoints):
    """--rollout hf_static evaluates as hf does (greedy, fp32); auto is hf on CPU; a bad name is a clear error."""
    from verl.workers.rollout.hf_rollout import HFRollout
    from verl.workers.rollout.static_rollout import StaticRollout

    test_file, _ = data
    texts = {}
    for name in ("hf", "hf_static"):
        policy = load_policy(checkpoints[0], "cpu", rollout=name, max_batch_size=4)
        cfg = EvalConfig(data=[str(test_file)], checkpoints=["tiny"], sim=True, limit=4, max_turns=2,
                         response_length=8, batch_size=4, out=str(tmp_path / name))
        evaluate(cfg, load=lambda c: policy, log=lambda msg: None)
        texts[name] = [json.loads(x)["text"] for x in (tmp_path / name / "trajectories.jsonl").read_text().splitlines()]
    assert texts["hf"] == texts["hf_static"] and len(texts["hf"]) == 4
    auto = load_policy(checkpoints[0], "cpu").generate.__self__
    assert type(auto) is HFRollout and not isinstance(auto, StaticRollout)
    assert isinstance(load_policy(checkpoints[0], "cpu", rollout="hf_static").generate.__self__, StaticRollout)
    with pytest.raises(EvalError, match="--rollout must be one of"):
        load_policy(checkpoints[0], "cpu", rollout="vllm")


def test_baselines_use_the_same_pool_and_scorer(tmp_path, tok, data):
    test_file, truth = data
    # direct prompts get the gold answer back (so EM 1 without a call); router prompts route to CHEAP
    gold = Scripted(tok, answer=lambda q: truth[q][0][0], route_to=None)
    route = Scripted(tok, answer=lambda q: "unused", route_to=CHEAP)

    def policy(prompts, sampling):
        direct = [NO_CONSULT in tok.decode(p) for p in prompts]
        assert len(set(direct)) == 1
        return (gold if direct[0] else route)(prompts, sampling)

    summary = run_eval(tmp_path, test_file, Policy(tok, policy, template=TEMPLATE), checkpoints=["p"],
                       skip_router=True, baselines=[f"largest:{BIG}", "all-singles", "direct", "prompt-llm"])
    runs = {r["label"]: r for r in summary["runs"]}
    names = ModelRegistry.from_yaml(SIM).seen().names
    assert list(runs) == ["direct", "prompt-llm", f"largest:{BIG}"] + [f"single:{n}" for n in names]
    records = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]

    for label, model in [(f"largest:{BIG}", BIG), *[(f"single:{n}", n) for n in names], ("prompt-llm", CHEAP)]:
        mine = [r for r in records if r["run"] == label]
        assert len(mine) == len(truth)
        for r in mine:
            reply, cost = reply_of(model, r["question"])
            first = reply.split(".")[0].strip()  # sim replies: "<answer>. <statement>" or "I don't know ..."
            assert r["turns"][0]["query"] == r["question"] and r["turns"][0]["information"] == reply
            assert r["answer"] == first and r["em"] == em_score(first, truth[r["question"]][0])
            assert r["cost_usd"] == pytest.approx(cost, rel=1e-12) and r["format_ok"]
        assert runs[label]["overall"]["model_share"][model] == 1.0
        assert runs[label]["overall"]["em"] == pytest.approx(np.mean([r["em"] for r in mine]))
    direct = runs["direct"]["overall"]
    assert direct["em"] == 1.0 and direct["calls"] == 0.0 and direct["cost_usd"] == 0.0
    assert any(NO_CONSULT in p for p in gold.prompts)


def test_report_joins_the_summaries_of_a_sweep(tmp_path, tok, data, capsys):
    test_file, truth = data
    paths = []
    for name, answer in [("right", lambda q: truth[q][0][0]), ("wrong", lambda q: "nobody")]:
        run_eval(tmp_path / name, test_file, Policy(tok, Scripted(tok, answer=answer)), checkpoints=[name])
        paths.append(tmp_path / name / "out" / "summary.json")
    assert report.main([*map(str, paths), "--out", str(tmp_path / "sweep.png")]) == 0
    table = capsys.readouterr().out
    assert re.search(r"^right +overall +6 +1\.000", table, re.M)
    assert re.search(r"^wrong +overall +6 +0\.000", table, re.M)
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert report.main([str(tmp_path / "missing.json")]) == 2


def test_reply_answer_takes_the_first_sentence():
    assert reply_answer("Kreris. The capital of Hekreme is Kreris. I hope this helps.") == "Kreris"
    assert reply_answer("Answer: Washington, D.C. It is on the Potomac.") == "Washington, D.C"
    assert reply_answer("Paris\nThe capital of France.") == "Paris"
    assert reply_answer("  Who knows?  Not me.") == "Who knows"
    assert reply_answer(None) == "" and reply_answer("") == ""
    assert em_score(reply_answer("Washington, D.C. It is on the Potomac."), ["Washington, D.C."]) == 1.0


def test_bootstrap_ci():
    x = np.array([1.0] * 200 + [0.0] * 200)
    lo, hi = bootstrap_ci(x, seed=0)
    assert bootstrap_ci(x, seed=0) == (lo, hi)
    half = 1.96 * math.sqrt(0.25 / len(x))  # the normal approximation for a proportion
    assert lo == pytest.approx(0.5 - half, abs=0.01) and hi == pytest.approx(0.5 + half, abs=0.01)
    lo_small, hi_small = bootstrap_ci(x[::20], seed=0)  # 20 samples: wider
    assert hi_small - lo_small > 2 * (hi - lo)
    assert bootstrap_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)


def test_pareto_front():
    pts = [(5.0, 0.4), (1.0, 0.3), (0.0, 0.1), (3.0, 0.2), (9.0, 0.4)]
    assert pareto_front(pts) == [2, 1, 0]  # (3, 0.2) and (9, 0.4) are beaten


def test_bad_rows_are_named(tmp_path, data):
    test_file, _ = data
    frame = pd.read_parquet(test_file)
    frame.at[1, "reward_model"] = {"style": "rule", "ground_truth": {"target": []}}
    bad = tmp_path / "bad.parquet"
    frame.to_parquet(bad)
    with pytest.raises(EvalError, match=rf"{re.escape(str(bad))} row 1: field 'reward_model.ground_truth.target'"):
        load_rows([bad])
    with pytest.raises(EvalError, match="holds no test"):
        find_data_files([str(tmp_path)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args, **env):
    return subprocess.run(["bash", str(REPO / "test.sh"), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={**os.environ, "PYTHON": sys.executable, **env})


def test_test_sh_evaluates_tiny_checkpoints_and_files_agree(tmp_path, data, checkpoints):
    test_file, truth = data
    out = tmp_path / "out"
    proc = _cli("--checkpoint", checkpoints[0], "--checkpoint", checkpoints[1], "--data", test_file, "--limit", 4,
                "--max-turns", 1, "--response-length", 6, "--baseline", f"largest:{BIG}", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "95% CI" in proc.stdout and "overall" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [r["label"] for r in summary["runs"]] == [checkpoints[0].name, checkpoints[1].name, f"largest:{BIG}"]
    assert summary["config"]["temperature"] is None  # greedy
    records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 4
    for run in summary["runs"]:
        for source, m in [*run["sources"].items(), ("overall", run["overall"])]:
            mine = [r for r in records if r["run"] == run["label"] and source in ("overall", r["data_source"])]
            assert m["n"] == len(mine)
            for key, field in [("em", "em"), ("f1", "f1"), ("format_ok", "format_ok"), ("cost_usd", "cost_usd"),
                               ("calls", "route_count"), ("reward", "reward")]:
                assert m[key] == pytest.approx(np.mean([float(r[field]) for r in mine])), (run["label"], key)
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("case", ["checkpoint", "column", "pool", "glob"])
def test_bad_input_is_one_line_naming_it(tmp_path, data, checkpoints, case, capsys):
    test_file, _ = data
    args = ["--checkpoint", checkpoints[0], "--data", test_file]
    if case == "checkpoint":
        args[1], needle = tmp_path / "nowhere", f"no checkpoint at {tmp_path / 'nowhere'}"
    elif case == "column":
        frame = pd.read_parquet(test_file).drop(columns=["reward_model"])
        frame.to_parquet(tmp_path / "nocol.parquet")
        args[3], needle = tmp_path / "nocol.parquet", f"{tmp_path / 'nocol.parquet'}: missing column 'reward_model'"
    elif case == "pool":
        url = f"http://127.0.0.1:{_free_port()}/v1"
        args += ["--pool", SIM, "--pool-url", url]
        needle = f"pool endpoint {url} is unreachable"
    else:
        args[3], needle = tmp_path / "none*.parquet", "no data file matches"
    if case == "checkpoint":  # once through test.sh in its own process: the exit code is real
        proc = _cli(*args)
        code, err = proc.returncode, proc.stderr
    else:
        code, err = evaluate_main([str(a) for a in args]), capsys.readouterr().err
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_a_dead_pool_ends_the_evaluation_with_exit_3_and_says_why(tmp_path, data, capsys):
    """The endpoint answers /models but every call fails: outputs are written, the exit code says so."""
    from router_r1.pool.server import FaultConfig, ServerThread

    test_file, truth = data
    sim = SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)
    args = ["--data", str(test_file), "--pool", str(SIM), "--skip-router", "--baseline", f"single:{CHEAP}",
            "--out", str(tmp_path / "out"), "--call-timeout-s", "5", "--call-deadline-s", "0.5"]
    with ServerThread(sim, faults=FaultConfig(error_rate=1.0)) as dead:
        code = evaluate_main([*args, "--pool-url", dead.url])
    err = capsys.readouterr()
    assert code == 3, err
    # 500s retried until the deadline stops the retries: counted by the kind that ended each call
    assert re.search(rf"run single:{CHEAP}: {len(truth)} of {len(truth)} pool calls failed \(100%: "
                     rf"(deadline|server_error) \d", err.err), err.err
    assert "--max-pool-failure-rate 0.2" in err.err and "--call-timeout-s 5" in err.err
    overall = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"][0]["overall"]
    assert overall["pool_failure_rate"] == 1.0 and sum(overall["pool_errors"].values()) == len(truth)
    label = re.escape(f"single:{CHEAP}".replace("-Instruct", ""))
    # failed 1.00, call p50 and p95 (the time to fail), srv p50 "-" (no answered call said the server's time)
    assert re.search(rf"^{label} +overall .* 1\.00 +\d+\.\d\d +\d+\.\d\d +-$", err.out, re.M), err.out
    # a healthy pool passes, its failure rate and latencies in the table; its deadline is generous, since a loaded
    # machine can take more than 0.5 s to answer a call (later flags win)
    with ServerThread(sim) as alive:
        assert evaluate_main([*args, "--pool-url", alive.url, "--call-deadline-s", "60"]) == 0
    out = capsys.readouterr().out
    assert re.search(r" overall .* 0\.00 +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d$", out, re.M), out  # call p50, p95, srv p50


def test_a_failed_evaluation_keeps_the_previous_outputs(tmp_path, tok, data):
    """The first run's outputs stay whole when a later evaluation into the same --out fails part way."""
    test_file, truth = data
    policy = Policy(tok, Scripted(tok, answer=lambda q: truth[q][0][0]))
    run_eval(tmp_path, test_file, policy, checkpoints=["s"], batch_size=4)
    out = tmp_path / "out"
    before = {n: (out / n).read_bytes() for n in ("summary.json", "trajectories.jsonl", "pareto.png")}

    def load(checkpoint):
        if checkpoint == "broken":
            raise EvalError("broken: cannot load")
        return policy

    cfg = EvalConfig(data=[str(test_file)], sim=True, out=str(out), max_obs_length=200, response_length=64,
                     max_response_length=1024, schedule="sync", checkpoints=["s", "broken"], batch_size=4)
    with pytest.raises(EvalError, match="broken: cannot load"):
        evaluate(cfg, load=load, log=lambda msg: None)
    assert {n: (out / n).read_bytes() for n in before} == before
    partial = (out / "trajectories.jsonl.partial").read_text().splitlines()
    assert len(partial) == len(truth)  # the run that finished is kept beside them


def test_evaluations_in_the_same_second_get_a_directory_each(tmp_path, tok, data, monkeypatch):
    test_file, truth = data
    monkeypatch.chdir(tmp_path)
    import time

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20250101-000000")  # one second for both
    policy = Policy(tok, Scripted(tok, answer=lambda q: truth[q][0][0]))
    dirs = []
    for _ in range(2):
        cfg = EvalConfig(data=[str(test_file)], sim=True, max_obs_length=200, response_length=64,
                         max_response_length=1024, schedule="sync", checkpoints=["s"], batch_size=4)
        dirs.append(Path(evaluate(cfg, load=lambda c: policy, log=lambda msg: None)["out_dir"]))
    assert [d.name for d in dirs] == ["20250101-000000", "20250101-000000-2"]
    for d in dirs:
        assert json.loads((d / "summary.json").read_text())["runs"][0]["overall"]["n"] == len(truth)
        assert len((d / "trajectories.jsonl").read_text().splitlines()) == len(truth)
