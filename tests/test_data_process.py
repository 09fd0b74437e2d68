"""Data builders: FlashRAG-style jsonl -> the router's parquet files (real datasets/pyarrow I/O)."""
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_process.build_qa import BuildConfig, Draw, build, main
from data_process.schema import DataBuildError, input_problem, make_row, validate_row
from router_r1.pool.registry import ModelRegistry

REPO = Path(__file__).resolve().parents[1]
FLASHRAG = REPO / "tests" / "data" / "flashrag"
BAD_NQ_TRAIN = REPO / "tests" / "data" / "flashrag_bad" / "nq" / "train.jsonl"
POOL = REPO / "configs" / "pool" / "paper.yaml"
SIZES = dict(train_size=5, val_size=2, test_size=3)
TEST_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("hf_cache")


def _cfg(out_dir, hf_cache, **kw):
    return BuildConfig(out_dir=out_dir, local_dir=kw.pop("local_dir", FLASHRAG), cache_dir=hf_cache, **{**SIZES, **kw})


def _rows(path):
    return pq.read_table(path).to_pylist()  # plain lists/dicts, as the schema check wants


def _source_rows(source, split, root=FLASHRAG):
    lines = (root / source / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def built(tmp_path_factory, hf_cache):
    out = tmp_path_factory.mktemp("built")
    report = build(_cfg(out, hf_cache))
    return out, report


def test_files_and_row_counts(built):
    out, report = built
    expected = {"train.parquet": 2 * 5, "val.parquet": 2 * 2}
    expected.update({f"test_{s}.parquet": 3 for s in TEST_SOURCES})
    expected["test_bamboogle.parquet"] = 5  # all of it by default
    assert {p.name: pq.read_metadata(p).num_rows for p in out.glob("*.parquet")} == expected
    assert {Path(p).name: n for p, n in report.files.items()} == expected
    assert Counter(r["data_source"] for r in _rows(out / "train.parquet")) == {"nq": 5, "hotpotqa": 5}
    assert report.skipped == {} and report.warnings == []


def test_rows_follow_schema_and_trace_back_to_their_source(built):
    out, _ = built
    for path in out.glob("*.parquet"):
        split = path.stem.split("_")[0]
        for i, row in enumerate(_rows(path)):
            validate_row(row, f"{path.name} row {i}")
            info = row["extra_info"]
            assert info["split"] == split
            original = _source_rows(row["data_source"], info["source_split"])[info["source_id"]]
            assert info["question"] == original["question"].strip()
            assert row["reward_model"]["ground_truth"]["target"] == original["golden_answers"]
            if split == "test":
                assert row["data_source"] == path.stem[len("test_"):]


def test_uids_unique_across_files_and_val_test_disjoint(built):
    out, _ = built
    rows = [r for p in sorted(out.glob("*.parquet")) for r in _rows(p)]
    uids = [r["extra_info"]["uid"] for r in rows]
    assert len(uids) == len(set(uids)) == 10 + 4 + 6 * 3 + 5
    # per-source index restarts, which is why the uid carries source and split
    assert {"nq-train-0", "hotpotqa-train-0", "hotpotqa-val-0", "hotpotqa-test-0"} <= set(uids)
    # HotpotQA's val and test both come from its dev split: they must not share a question
    val = {r["extra_info"]["source_id"] for r in _rows(out / "val.parquet") if r["data_source"] == "hotpotqa"}
    test = {r["extra_info"]["source_id"] for r in _rows(out / "test_hotpotqa.parquet")}
    assert len(val) == 2 and len(test) == 3 and not val & test


def test_prompt_lists_every_seen_model_and_the_question(built):
    out, _ = built
    registry = ModelRegistry.from_yaml(POOL)
    seen = registry.seen().names
    unseen = [n for n in registry.names if n not in seen]
    assert len(seen) == 6 and len(unseen) == 2
    for row in _rows(out / "train.parquet") + _rows(out / "test_bamboogle.parquet"):
        [message] = row["prompt"]
        assert message["role"] == "user"
        assert row["extra_info"]["question"] in message["content"]
        assert all(name in message["content"] for name in seen)
        assert not any(name in message["content"] for name in unseen)


def test_same_seed_same_bytes_other_seed_other_sample(tmp_path, hf_cache, built):
    out, _ = built
    build(_cfg(tmp_path / "again", hf_cache))
    for path in out.glob("*.parquet"):
        assert (tmp_path / "again" / path.name).read_bytes() == path.read_bytes(), path.name
    build(_cfg(tmp_path / "other", hf_cache, seed=7))

    def ids(p):
        return [(r["data_source"], r["extra_info"]["source_id"]) for r in _rows(p)]
    assert ids(tmp_path / "other" / "train.parquet") != ids(out / "train.parquet")
    assert ids(tmp_path / "other" / "test_nq.parquet") != ids(out / "test_nq.parquet")


def test_too_few_rows_takes_all_and_warns_with_counts(tmp_path, hf_cache, capsys):
    report = build(_cfg(tmp_path, hf_cache, train_size=100), draws=[Draw("train", "nq", "train", 100)])
    assert report.files == {str(tmp_path / "train.parquet"): 8}
    assert "has 8 usable rows for draws asking train 100; drawing train 8" in capsys.readouterr().err
    assert len(report.warnings) == 1


@pytest.fixture
def bad_dir(tmp_path):
    """The sample collection with nq/train replaced by the file of deliberately bad rows."""
    root = tmp_path / "flashrag"
    shutil.copytree(FLASHRAG, root)
    shutil.copy(BAD_NQ_TRAIN, root / "nq" / "train.jsonl")
    return root


def test_bad_rows_are_skipped_and_counted(tmp_path, hf_cache, bad_dir, capsys):
    assert main(["--local-dir", str(bad_dir), "--out-dir", str(tmp_path / "out"), "--cache-dir", str(hf_cache),
                 "--train-size", "4", "--val-size", "2", "--test-size", "3"]) == 0
    printed = capsys.readouterr().out
    assert "skipped 4 bad rows of nq/train" in printed
    path = bad_dir / "nq" / "train.jsonl"
    for reason, line in (("missing question", 2), ("empty question", 4), ("empty golden_answers", 5),
                         ("missing golden_answers", 7)):
        assert f"{reason}: 1 (first at {path} line {line})" in printed
    assert "read nq/train: question from 'question', golds from 'golden_answers' (3 rows: a list, " \
           "1 rows: a string, read as one gold)" in printed
    nq = [r for r in _rows(tmp_path / "out" / "train.parquet") if r["data_source"] == "nq"]
    assert sorted(r["extra_info"]["source_id"] for r in nq) == ["train_0", "train_2", "train_5", "train_7"]


def test_strict_turns_a_bad_row_into_an_error_naming_it(tmp_path, bad_dir):
    # a real process: the CLI must exit with a message, not a traceback
    proc = subprocess.run(
        [sys.executable, "-m", "data_process.build_qa", "--local-dir", str(bad_dir), "--strict",
         "--out-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "hf"),
         "--train-size", "3", "--val-size", "2", "--test-size", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"error: {bad_dir / 'nq' / 'train.jsonl'} line 2: missing question (--strict)" in proc.stderr
    assert not (tmp_path / "out" / "train.parquet").exists()


def test_missing_column_is_an_error_naming_it(tmp_path, hf_cache):
    (tmp_path / "nq").mkdir()
    rows = [{"id": "q0", "question": "who wrote hamlet", "label": ["Shakespeare"]}]
    (tmp_path / "nq" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataBuildError, match=r"nq/train .*train\.jsonl.*missing column 'golden_answers' "
                                             r"\(or 'answers' / 'answer'; columns: id, question, label\)"):
        build(_cfg(tmp_path / "out", hf_cache, local_dir=tmp_path), draws=[Draw("train", "nq", "train", 1)])
    (tmp_path / "nq" / "train.jsonl").write_text(json.dumps({"query": "q", "answer": "a"}) + "\n")
    with pytest.raises(DataBuildError, match=r"train\.jsonl\): missing column 'question' \(columns: query, answer\)"):
        build(_cfg(tmp_path / "out", hf_cache, local_dir=tmp_path), draws=[Draw("train", "nq", "train", 1)])
    with pytest.raises(DataBuildError, match=r"none of .*popqa/test\.jsonl, .*popqa/test\.parquet, .*popqa\.jsonl"):
        build(_cfg(tmp_path / "out", hf_cache, local_dir=tmp_path), draws=[Draw("test", "popqa", "test", 1)])


def test_parquet_input_reads_like_jsonl(tmp_path, hf_cache, built):
    import pandas as pd

    (tmp_path / "bamboogle").mkdir()
    pd.read_json(FLASHRAG / "bamboogle" / "test.jsonl", lines=True).to_parquet(tmp_path / "bamboogle" / "test.parquet")
    build(_cfg(tmp_path / "out", hf_cache, local_dir=tmp_path), draws=[Draw("test", "bamboogle", "test", None)])
    assert _rows(tmp_path / "out" / "test_bamboogle.parquet") == _rows(built[0] / "test_bamboogle.parquet")


def test_prompt_template_turn_budget_and_unseen_models(tmp_path, hf_cache):
    template = tmp_path / "short.txt"
    template.write_text("Route this. {budget}Pool:\n{pool}\nQ: {question}\n")
    assert main(["--local-dir", str(FLASHRAG), "--out-dir", str(tmp_path / "out"), "--cache-dir", str(hf_cache),
                 "--prompt-template", str(template), "--turn-budget", "2", "--include-unseen",
                 "--train-size", "2", "--val-size", "1", "--test-size", "1", "--bamboogle-size", "1"]) == 0
    for row in _rows(tmp_path / "out" / "train.parquet"):
        content = row["prompt"][0]["content"]
        assert content.startswith("Route this. You may consult the models at most 2 times")
        assert content.endswith(f"\nQ: {row['extra_info']['question']}\n")
        assert "Palmyra-Creative-122B" in content and "LLaMA-3.1-70B-Instruct" in content
    assert pq.read_metadata(tmp_path / "out" / "test_bamboogle.parquet").num_rows == 1


def test_bad_template_file_is_an_error_naming_it(tmp_path, hf_cache, capsys):
    template = tmp_path / "no_question.txt"
    template.write_text("Models: {pool}\n")
    args = ["--local-dir", str(FLASHRAG), "--out-dir", str(tmp_path / "out"), "--cache-dir", str(hf_cache)]
    assert main(args + ["--prompt-template", str(template)]) == 1
    assert f"{template}: template has no {{question}} placeholder" in capsys.readouterr().err
    assert main(args + ["--prompt-template", str(tmp_path / "absent.txt")]) == 1
    assert "absent.txt: template file not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_prompt_dataset_loads_the_train_file(built):
    from tiny import tiny_tokenizer
    from verl.trainer.dataset import PromptDataset

    out, _ = built
    tok = tiny_tokenizer()
    ds = PromptDataset(str(out / "train.parquet"), tok, max_prompt_length=4096)
    rows = _rows(out / "train.parquet")
    assert [r.uid for r in ds.rows] == [r["extra_info"]["uid"] for r in rows]
    first = ds.rows[0]
    assert tok.decode(first.prompt_ids).endswith("<|im_start|>assistant\n")
    assert first.fields["reward_model"]["ground_truth"]["target"] == rows[0]["reward_model"]["ground_truth"]["target"]
    # train + val together: still no uid collision (the reference's GRPO bug)
    assert len(PromptDataset([str(out / "train.parquet"), str(out / "val.parquet")], tok)) == 14


def test_input_problem_and_validate_row():
    assert input_problem("q?", ["x"]) is None
    assert input_problem(None, ["x"]) == "missing question"
    assert input_problem("  ", ["x"]) == "empty question"
    assert input_problem("q?", None) == "missing golden_answers"
    assert input_problem("q?", ["", " "]) == "empty golden_answers"
    assert input_problem("q?", "x") == "golden_answers is a str, not a list"
    assert input_problem("q?", ["x", 3]) == "golden_answers holds a non-string"
    assert input_problem("q?", ["The", "?!", ""], "answer") == "empty answer"  # nothing that EM could require
    prompt = [{"role": "user", "content": "Q: q?"}]
    row = make_row("nq", "train", 4, "q?", ["a"], prompt, "train", "train_9")
    validate_row(row, "row")
    assert row["extra_info"]["uid"] == "nq-train-4"
    row["extra_info"]["uid"] = "nq-4"
    with pytest.raises(DataBuildError, match=r"here: field 'extra_info.uid'"):
        validate_row(row, "here")
    row = make_row("nq", "train", 4, "q?", [], prompt, "train", "train_9")
    with pytest.raises(DataBuildError, match=r"field 'reward_model.ground_truth.target'"):
        validate_row(row, "here")


def test_draws_share_a_small_file_and_too_few_rows_fail_before_drawing(tmp_path, hf_cache, capsys):
    # hotpotqa/dev (8 rows) feeds test and val: the paper's 500 + 100 become 7 + 1, with a warning
    report = build(_cfg(tmp_path / "a", hf_cache, test_size=500, val_size=100),
                   draws=[Draw("test", "hotpotqa", "dev", 500), Draw("val", "hotpotqa", "dev", 100)])
    assert sorted(report.files.values()) == [1, 7]
    assert "drawing test 7, val 1 (in proportion" in capsys.readouterr().err
    # "all" takes the rest after the sized draws
    report = build(_cfg(tmp_path / "b", hf_cache),
                   draws=[Draw("test", "hotpotqa", "dev", None), Draw("val", "hotpotqa", "dev", 2)])
    assert report.files == {str(tmp_path / "b" / "val.parquet"): 2, str(tmp_path / "b" / "test_hotpotqa.parquet"): 6}
    assert not report.warnings
    one = tmp_path / "one" / "hotpotqa"
    one.mkdir(parents=True)
    (one / "dev.jsonl").write_text(json.dumps({"question": "q?", "answer": "Lima"}) + "\n")
    with pytest.raises(DataBuildError, match=r"1 usable rows cannot feed 2 draws \(test, val\)"):
        build(_cfg(tmp_path / "c", hf_cache, local_dir=one.parent),
              draws=[Draw("test", "hotpotqa", "dev", None), Draw("val", "hotpotqa", "dev", 2)])
    assert not (tmp_path / "c").exists()


# ---- the simulated world's data (sim.qa) -------------------------------------

SIM_SIZES = dict(train_size=40, val_size=10, test_size=20)


@pytest.fixture(scope="module")
def sim_built(tmp_path_factory):
    from sim.qa import SimConfig, build_sim

    out = tmp_path_factory.mktemp("sim")
    return out, build_sim(SimConfig(out_dir=out, **SIM_SIZES))


def _answer_in_world(world, question):
    """Read the question back through the world's own parser and follow its fact chain."""
    parsed = world.parse(question)
    assert parsed is not None and parsed.relations, question
    subject = parsed.entity.name
    for relation in parsed.relations:
        subject = world.fact(relation.name, subject).object
    return subject, tuple(r.name for r in parsed.relations), parsed.entity.name


def test_sim_files_schema_and_answers(sim_built):
    from sim.world import SimWorld

    out, written = sim_built
    assert {Path(p).name: n for p, n in written.items()} == {"train.parquet": 40, "val.parquet": 10, "test.parquet": 20}
    world = SimWorld(seed=0)  # the simulated pool's default world
    chains = {}
    uids = []
    for split in ("train", "val", "test"):
        rows = _rows(out / f"{split}.parquet")
        assert Counter(r["data_source"] for r in rows) == {"sim_1hop": 0.6 * len(rows), "sim_2hop": 0.4 * len(rows)}
        for i, row in enumerate(rows):
            validate_row(row, f"{split} row {i}")
            info = row["extra_info"]
            assert info["split"] == split and info["source_split"] == ("train" if split == "train" else "test")
            answer, relations, entity = _answer_in_world(world, info["question"])
            assert row["reward_model"]["ground_truth"]["target"] == [answer]
            assert len(relations) == (1 if row["data_source"] == "sim_1hop" else 2)
            chains.setdefault(split, set()).add((entity, relations))
            uids.append(info["uid"])
    assert len(uids) == len(set(uids)) == 70
    assert not chains["val"] & chains["test"] and not chains["train"] & chains["test"]


def test_sim_val_uses_no_fact_of_test_at_the_default_sizes():
    """A choice made on val (a probe share, the best step) must not have seen a test fact (issue 44.6)."""
    from sim.qa import SimConfig, draw_questions

    split = draw_questions(SimConfig())
    facts = {s: {(h.relation, h.subject) for q in split[s] for h in q.hops} for s in ("val", "test")}
    assert len(split["val"]) == 100 and sum(len(q.hops) == 2 for q in split["val"]) == 40
    assert not facts["val"] & facts["test"]


def test_sim_val_too_large_for_the_held_out_facts_is_refused_by_name():
    from sim.qa import SimConfig, draw_questions

    with pytest.raises(DataBuildError, match="only 230 validation questions share no fact with the 300 test"):
        draw_questions(SimConfig(val_size=250))


def test_sim_prompt_lists_the_sim_pool_and_is_deterministic(tmp_path, sim_built):
    from router_r1.pool.world import SIM_POOL
    from sim.qa import SimConfig, build_sim

    out, _ = sim_built
    seen = ModelRegistry.from_yaml(SIM_POOL).seen()
    for row in _rows(out / "train.parquet"):
        content = row["prompt"][0]["content"]
        assert row["extra_info"]["question"] in content
        assert all(spec.name in content and spec.descriptor in content for spec in seen.models.values())
    build_sim(SimConfig(out_dir=tmp_path / "again", **SIM_SIZES))
    for name in ("train.parquet", "val.parquet", "test.parquet"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    build_sim(SimConfig(out_dir=tmp_path / "world1", world_seed=1, **SIM_SIZES))
    questions = [r["extra_info"]["question"] for r in _rows(out / "test.parquet")]
    assert [r["extra_info"]["question"] for r in _rows(tmp_path / "world1" / "test.parquet")] != questions


def test_sim_too_many_questions_is_a_clear_error(tmp_path, capsys):
    from sim.qa import main as sim_main

    assert sim_main(["--out-dir", str(tmp_path), "--test-size", "100000"]) == 1
    assert "test questions asked, only" in capsys.readouterr().err and not any(tmp_path.iterdir())
