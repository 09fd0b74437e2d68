"""A user's own QA files, through build_qa and evaluation: veRL's RL layout as Search-R1 and veRL's recipes write
it, read as it is; the user's row ids kept in trajectories.jsonl; repeated questions or ids reported; questions over
--max-question-chars refused naming their row; build_qa --pool used or refused, never ignored; rows built with
another template prompted with the router's own."""
import json
import re
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from data_process.build_qa import main as build_main
from router_r1.eval.evaluate import EvalConfig, EvalError, Policy, evaluate, load_rows
from router_r1.eval.evaluate import main as evaluate_main
from verl.workers.rollout.base import GenOutput

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "configs" / "pool" / "sim.yaml"
TEMPLATE = "Route or answer.\n{budget}Question: {question}\n"  # the router's own (its prompt_template.txt)
QA = {"Who wrote Hamlet?": ["William Shakespeare", "Shakespeare"], "What is the capital of Peru?": ["Lima"],
      "Which planet has rings?": ["Saturn"]}
SEARCH_R1_PREFIX = ("Answer the given question. You must conduct reasoning inside <think> and </think> first every "
                    "time you get new information. ... Question: ")


def search_r1_rows() -> list[dict]:
    """Search-R1's scripts/data_process/nq_search.py: FlashRAG's columns kept, its own prompt, golds as
    ground_truth.target, extra_info {split, index}."""
    return [{"id": f"test_{i}", "question": q, "golden_answers": g, "data_source": "nq",
             "prompt": [{"role": "user", "content": SEARCH_R1_PREFIX + q + "\n"}], "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": g}},
             "extra_info": {"split": "test", "index": i}} for i, (q, g) in enumerate(QA.items())]


def verl_search_rows() -> list[dict]:
    """veRL's examples/data_preprocess/preprocess_search_r1_dataset.py: a system message, extra_info.question."""
    return [{"data_source": "searchR1_nq", "ability": "fact-reasoning",
             "prompt": [{"role": "system", "content": "You are a helpful and harmless assistant."},
                        {"role": "user", "content": "Answer with <answer>. Question: " + q}],
             "reward_model": {"style": "rule", "ground_truth": {"target": g}},
             "extra_info": {"index": 10 + i, "need_tools_kwargs": True, "question": q, "split": "test"}}
            for i, (q, g) in enumerate(QA.items())]


def gsm8k_like_rows() -> list[dict]:
    """veRL's examples/data_preprocess/gsm8k.py: ground_truth a bare string, extra_info.question and answer; an
    `uid` column of the user's."""
    return [{"uid": f"u{i}", "data_source": "mine", "ability": "qa",
             "prompt": [{"role": "user", "content": q + " Let's think step by step."}],
             "reward_model": {"style": "rule", "ground_truth": g[0]},
             "extra_info": {"split": "test", "index": i, "answer": f"... #### {g[0]}", "question": q}}
            for i, (q, g) in enumerate(QA.items())]


def prompt_only_rows() -> list[dict]:
    """No question field anywhere: the question is the last user message."""
    return [{"data_source": "bare", "prompt": [{"role": "user", "content": q}],
             "reward_model": {"style": "rule", "ground_truth": g}, "extra_info": {"split": "test", "index": i}}
            for i, (q, g) in enumerate(QA.items())]


LAYOUTS = {"search_r1": search_r1_rows, "verl_search": verl_search_rows, "gsm8k_like": gsm8k_like_rows,
           "prompt_only": prompt_only_rows}
IDS = {"search_r1": ["test_0", "test_1", "test_2"], "verl_search": ["10", "11", "12"], "gsm8k_like": ["u0", "u1", "u2"],
       "prompt_only": ["0", "1", "2"]}


def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


class Answers:
    """A router that answers at once, from the question its prompt states; records the prompts it saw."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    def __call__(self, prompts, sampling):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            self.prompts.append(text)
            question = re.search(r"Question: (.*?)\n", text).group(1)
            answer = QA.get(question, ["nobody"])[0]
            out.append(GenOutput(self.tok(f"<think>x</think><answer>{answer}</answer>",
                                          add_special_tokens=False)["input_ids"], "stop"))
        return out


def run(tmp_path, files, tok, **kw):
    """evaluate() with the Answers router, prompted with TEMPLATE; (summary, records, log lines, router)."""
    router, logged = Answers(tok), []
    cfg = EvalConfig(data=[str(f) for f in files], sim=True, checkpoints=["own"], out=str(tmp_path / "out"),
                     schedule="sync", response_length=32, max_response_length=256, **kw)
    summary = evaluate(cfg, load=lambda c: Policy(tok, router, template=TEMPLATE, template_source="its template"),
                       log=logged.append)
    records = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    return summary, records, logged, router


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_evaluation_reads_verl_s_rl_layout_as_it_is(tmp_path, tok, layout):
    test_file = write(tmp_path / f"{layout}.parquet", LAYOUTS[layout]())
    summary, records, logged, router = run(tmp_path, [test_file], tok)
    assert [r["question"] for r in records] == list(QA)  # extra_info.question, a question column, or the prompt
    golds = [[g[0]] for g in QA.values()] if layout == "gsm8k_like" else list(QA.values())
    assert [r["golds"] for r in records] == golds  # ground_truth.target (a list), or ground_truth itself (a string)
    assert all(r["em"] == 1.0 for r in records) and summary["runs"][0]["overall"]["em"] == 1.0
    assert [r["source_id"] for r in records] == IDS[layout]  # the user's ids, kept
    # their own prompts were not the router's: each rebuilt from its question with the router's template
    assert len(router.prompts) == 3
    assert all("Route or answer.\nQuestion: " in p and "Answer" not in p for p in router.prompts), router.prompts
    assert any("rebuilt from their questions" in m and "3 of 3 rows" in m and "its template" in m for m in logged)


def test_build_qa_reads_verl_s_rl_layout_and_keeps_the_ids(tmp_path, tok, capsys):
    sources = []
    for name, rows in LAYOUTS.items():
        sources.append(f"{name}={write(tmp_path / 'in' / f'{name}.parquet', rows())}")
    code = build_main(["--out-dir", str(tmp_path / "out"), "--sources", ",".join(sources), "--splits", "test",
                       "--pool", str(SIM)])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in LAYOUTS:
        rows = pq.read_table(tmp_path / "out" / f"test_{name}.parquet").to_pylist()
        got = {r["extra_info"]["question"]: (r["reward_model"]["ground_truth"]["target"], r["extra_info"]["source_id"])
               for r in rows}
        golds = QA if name != "gsm8k_like" else {q: [g[0]] for q, g in QA.items()}
        assert got == {q: (golds[q], i) for q, i in zip(QA, IDS[name])}, name
    assert "read verl_search/verl_search.parquet: question from 'extra_info.question', golds from " \
           "'reward_model.ground_truth.target' (3 rows: a list)" in out
    assert "read prompt_only/prompt_only.parquet: question from 'prompt (its last user message)', golds from " \
           "'reward_model.ground_truth' (3 rows: a list)" in out
    assert "golds from 'reward_model.ground_truth' (3 rows: a string, read as one gold)" in out  # gsm8k's

    # and evaluation keeps the input file's ids, carried as extra_info.source_id
    _, records, _, _ = run(tmp_path, [tmp_path / "out" / "test_gsm8k_like.parquet"], tok)
    assert [r["source_id"] for r in records] == IDS["gsm8k_like"]


def test_repeated_questions_and_ids_are_reported_with_counts_and_rows(tmp_path, tok, capsys):
    q = list(QA)
    rows = [{"id": f"r{i}", "question": q[0] if i % 2 else q[i % 3], "answer": QA[q[0] if i % 2 else q[i % 3]][0]}
            for i in range(12)]
    rows[11]["id"] = "r1"  # an id given twice
    src = tmp_path / "in" / "mine.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert build_main(["--out-dir", str(tmp_path / "out"), "--sources", f"mine={src}", "--splits", "test",
                       "--pool", str(SIM)]) == 0
    err = capsys.readouterr().err
    # questions (0-based rows): q0 at 0, 1, 3, 5, 6, 7, 9, 11; q2 at 2 and 8; q1 at 4 and 10
    assert (f"warning: mine/mine.jsonl ({src}): 9 rows repeat an earlier question (3 distinct questions appear "
            f"more than once; {q[0]!r} 8 times); first repeats at line 2, line 4, line 6, line 7, line 8, ...") in err
    assert "1 rows repeat an earlier id (1 distinct ids appear more than once; 'r1' 2 times); first repeats at " \
           "line 12" in err

    test_file = tmp_path / "out" / "test_mine.parquet"  # evaluation says the same of the rows it reads
    _, records, logged, _ = run(tmp_path, [test_file], tok)
    assert len(records) == 12
    (warning,) = [m for m in logged if "repeat an earlier question" in m]
    assert warning == (f"WARNING: {test_file}: 9 rows repeat an earlier question (3 distinct questions appear more "
                       f"than once; {q[0]!r} 8 times); first repeats at row 1, row 3, row 5, row 6, row 7, ...")
    assert any("1 rows repeat an earlier id" in m for m in logged)


def test_a_question_over_the_bound_is_refused_naming_its_row(tmp_path, tok, capsys):
    rows = verl_search_rows()
    rows[2]["extra_info"]["question"] = "Why? " * 5_000  # 25,000 characters
    test_file = write(tmp_path / "long.parquet", rows)
    code = evaluate_main(["--skip-router", "--baseline", "single:Mixtral-8x22B-Instruct", "--data", str(test_file),
                          "--sim", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (f"error: {test_file} row 2: question too long (25,000 characters, over --max-question-chars 20,000) "
            "(field extra_info.question)") in err
    assert not (tmp_path / "out").exists()
    assert len(load_rows([test_file], max_question_chars=30_000, log=lambda m: None)) == 3  # the bound is a flag
    with pytest.raises(EvalError, match="row 0: question too long"):
        load_rows([test_file], max_question_chars=10)

    # build_qa: a bad row, counted with its place (--strict: an error naming it)
    src = tmp_path / "in" / "mine.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps({"question": q, "answer": g}) + "\n"
                           for q, g in [*QA.items(), ("Why? " * 5_000, ["x"])]))
    args = ["--out-dir", str(tmp_path / "b"), "--sources", f"mine={src}", "--splits", "test", "--pool", str(SIM)]
    assert build_main(args) == 0
    out = capsys.readouterr().out
    assert "question too long: 1 (first at " + f"{src} line 4)" in out
    assert len(pq.read_table(tmp_path / "b" / "test_mine.parquet")) == 3
    assert build_main(args + ["--strict"]) == 1
    assert (f"{src} line 4: question too long (25,000 characters, over --max-question-chars 20,000) (--strict)"
            in capsys.readouterr().err)
    assert build_main(args + ["--max-question-chars", "30000"]) == 0


def test_build_qa_pool_is_used_or_refused(tmp_path, capsys):
    src = tmp_path / "in" / "mine.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps({"question": q, "answer": g}) + "\n" for q, g in QA.items()))
    base = ["--sources", f"mine={src}", "--splits", "test"]
    baked = tmp_path / "baked.txt"  # the embedded run's kind of template: the models written into its text
    baked.write_text("Models:\nLLaMA-3.1-8B-Instruct $0.18: geography\nQuestion: {question}\n")
    code = build_main(["--out-dir", str(tmp_path / "x"), *base, "--prompt-template", str(baked), "--pool", str(SIM)])
    err = capsys.readouterr().err
    assert code == 1 and f"--pool {SIM}: the prompt template {baked} has no pool placeholder ({{pool}}, " in err
    assert not (tmp_path / "x").exists()  # was built, every prompt listing the template's models, the pool unread
    assert build_main(["--out-dir", str(tmp_path / "y"), *base, "--prompt-template", str(baked)]) == 0  # no --pool
    # with a pool placeholder, the prompts list the pool's models
    listed = tmp_path / "listed.txt"
    listed.write_text("Models:\n{pool}\nQuestion: {question}\n")
    for pool in ("sim", "paper"):
        assert build_main(["--out-dir", str(tmp_path / pool), *base, "--prompt-template", str(listed), "--pool",
                           str(REPO / "configs" / "pool" / f"{pool}.yaml")]) == 0
    sim, paper = (pq.read_table(tmp_path / p / "test_mine.parquet").to_pylist()[0]["prompt"][0]["content"]
                  for p in ("sim", "paper"))
    assert sim != paper and "Mixtral-8x22B-Instruct" in sim
    cards = tmp_path / "cards.txt"  # any listing placeholder lists the pool
    cards.write_text("Models:\n{pool_card}\nQuestion: {question}\n")
    assert build_main(["--out-dir", str(tmp_path / "c"), *base, "--prompt-template", str(cards), "--pool", str(SIM)]) == 0
