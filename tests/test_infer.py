"""infer.py: one question's trajectory, turn by turn, against the real simulated pool server."""
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import infer
from router_r1.eval.baselines import reply_answer
from router_r1.eval.evaluate import Policy
from router_r1.pool.registry import ModelRegistry
from sim.backend import SimBackend
from sim.world import SimWorld
from router_r1.pool.messages import submodel_messages
from router_r1.reward.qa_em import em_score
from router_r1.router_env import RouterEnvConfig
from router_r1.runtime import open_pool
from tiny import tiny_model
from verl.workers.rollout.base import GenOutput, SamplingParams

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "configs" / "pool" / "sim.yaml"
BIG = "Mixtral-8x22B-Instruct"
TEMPLATE = "Route or answer.\n{budget}Question: {question}\n"


@pytest.fixture(scope="module")
def question():
    return SimWorld(seed=0).questions(1, seed=5, split="test", two_hop_frac=0.0)[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tok):
    d = tmp_path_factory.mktemp("ckpt")
    tok.save_pretrained(d)
    tiny_model(len(tok)).save_pretrained(d)
    (d / "prompt_template.txt").write_text(TEMPLATE)  # the template it was "trained" with
    return d


def scripted(tok):
    """Turn 1 routes the question to BIG; turn 2 answers with the first sentence of the reply."""
    def generate(prompts, sampling):
        text = tok.decode(prompts[0])
        info = re.search(r"<information>(.*?)</information>", text, re.DOTALL)
        if info is None:
            q = re.search(r"Question: (.*)\n", text).group(1)
            turn = f"<think>a {BIG} question</think><search>{BIG}: {q}</search>"
        else:
            turn = f"<think>the reply says it</think><answer>{info.group(1).split('.')[0].strip()}</answer>"
        return [GenOutput(tok(turn, add_special_tokens=False)["input_ids"], "stop")]
    return generate


def test_run_question_records_and_renders_every_turn(tok, question):
    spec = ModelRegistry.from_yaml(SIM)[BIG]
    reply, _, completion = SimBackend.from_pool_yaml(SIM).respond(spec.api_id, submodel_messages(question.question),
                                                                   spec.max_tokens)
    expected_answer = reply_answer(reply)
    rcfg = RouterEnvConfig(max_turns=2, max_obs_length=200, response_length=64, max_response_length=1024,
                           schedule="sync")
    with open_pool(sim=True) as pool:
        record = infer.run_question(question.question, Policy(tok, scripted(tok), template=TEMPLATE), pool, rcfg,
                                    SamplingParams(greedy=True, temperature=0.0), gold=question.answers)
    route, answer = record["turns"]
    assert route["action"] == "route" and route["model"] == BIG and route["query"] == question.question
    assert route["think"] == f"a {BIG} question" and route["information"] == reply and route["ok"]
    assert route["cost_usd"] == pytest.approx(completion * spec.price_out_per_m / 1e6, rel=1e-12)
    assert answer["action"] == "answer" and answer["answer"] == expected_answer == record["answer"]
    assert record["em"] == em_score(expected_answer, question.answers) and record["format_ok"]
    assert record["cost_usd"] == route["cost_usd"] and record["calls"] == 1
    assert len(record["latencies"]["generation_s"]) == 2 and record["latencies"]["pool_s"] == [route["latency_s"]]
    json.dumps(record)  # --json prints it as is

    plain = infer.render(record, color=False)
    assert "\x1b[" not in plain
    for needle in (f"Question: {question.question}", f"route   {BIG}: {question.question}", reply.split(".")[0],
                   f"answer  {expected_answer}", "format ok", f"EM {record['em']:.0f}", "1 call(s)"):
        assert needle in plain, needle
    coloured = infer.render(record, color=True)
    assert "\x1b[" in coloured and re.sub(r"\x1b\[[0-9;]*m", "", coloured) == plain


def test_main_with_a_tiny_checkpoint_prints_plain_text_when_piped(checkpoint, question, capsys):
    rc = infer.main(["--question", question.question, "--checkpoint", str(checkpoint), "--max-turns", "1",
                     "--response-length", "6", "--sim-latency", "0"])
    out = capsys.readouterr().out
    assert rc == 0 and "\x1b[" not in out  # captured output is not a terminal
    assert out.startswith(f"Question: {question.question}") and "Turn 1" in out and "Cost: $" in out


def test_main_json_end_to_end(checkpoint, question, capsys):
    rc = infer.main(["--question", question.question, "--checkpoint", str(checkpoint), "--json",
                     "--gold", *question.answers, "--max-turns", "1", "--response-length", "6", "--sim-latency", "0"])
    assert rc == 0
    record = json.loads(capsys.readouterr().out)  # one JSON object, nothing else on stdout
    assert record["question"] == question.question and record["checkpoint"] == str(checkpoint)
    assert record["prompt_tokens"] < 100  # the checkpoint's prompt_template.txt, not the long default
    assert 1 <= len(record["turns"]) <= 2 and record["em"] in (0.0, 1.0)
    assert record["cost_usd"] == pytest.approx(sum(t["cost_usd"] or 0.0 for t in record["turns"]))
    assert len(record["latencies"]["generation_s"]) == len(record["turns"])


def _run(*args):
    """infer.py as a script, in its own process."""
    return subprocess.run([sys.executable, str(REPO / "infer.py"), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_missing_checkpoint_and_unreachable_pool_are_one_line_errors(checkpoint, tmp_path):
    proc = _run("--question", "Who?", "--checkpoint", tmp_path / "nowhere")
    assert proc.returncode == 2
    expected = (f"error: no checkpoint at {tmp_path / 'nowhere'} or {tmp_path / 'nowhere' / 'hf'} (no config.json); "
                "--checkpoint takes a run's output dir, its hf/ export or an HF model dir (run bash train.sh first)\n")
    assert proc.stderr == expected
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    proc = _run("--question", "Who?", "--checkpoint", checkpoint, "--pool", SIM, "--pool-url", url)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert f"pool endpoint {url} is unreachable" in proc.stderr
