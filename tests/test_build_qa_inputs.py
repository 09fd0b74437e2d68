"""build_qa on the files users bring: the common answer layouts, a subset of sources and splits, files in
their own layout (NAME=PATH, flat DIR/<name>.jsonl), bytes that are not UTF-8, rows whose golds are not
strings, JSON that cannot be kept (lone surrogates, deep nesting, huge numbers) and empty files (real files)."""
import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from data_process.build_qa import main
from data_process.schema import DataBuildError

REPO = Path(__file__).resolve().parents[1]
FLASHRAG = REPO / "tests" / "data" / "flashrag"
QUESTIONS = ["Who wrote Hamlet?", "What is the capital of Peru?", "Which planet has rings?"]


def _jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _golds(path: Path) -> dict[str, list[str]]:
    rows = pq.read_table(path).to_pylist()
    return {r["extra_info"]["question"]: r["reward_model"]["ground_truth"]["target"] for r in rows}


def _build(tmp_path, *args):
    return main(["--out-dir", str(tmp_path / "out"), *map(str, args)])


def test_each_answer_layout_is_read_and_named(tmp_path, capsys):
    src = tmp_path / "in"
    golds = [["William Shakespeare", "Shakespeare"], ["Lima"], ["Saturn"]]
    _jsonl(src / "flash" / "test.jsonl", [{"question": q, "golden_answers": g} for q, g in zip(QUESTIONS, golds)])
    # R1-Searcher's layout: one gold as a string
    _jsonl(src / "r1s" / "test.jsonl", [{"question": q, "answer": g[0]} for q, g in zip(QUESTIONS, golds)])
    _jsonl(src / "lists" / "dev.jsonl", [{"question": q, "answer": g} for q, g in zip(QUESTIONS, golds)])
    _jsonl(src / "squad" / "test.jsonl", [{"question": q, "answers": {"text": g, "answer_start": [0] * len(g)}}
                                          for q, g in zip(QUESTIONS, golds)])
    (src / "pq").mkdir()
    pd.DataFrame({"question": QUESTIONS, "answers": golds}).to_parquet(src / "pq" / "test.parquet")
    assert _build(tmp_path, "--local-dir", src, "--sources", "flash,r1s,lists:dev,squad,pq", "--splits", "test") == 0
    out = tmp_path / "out"
    names = ("flash", "lists", "pq", "r1s", "squad")
    assert sorted(p.name for p in out.iterdir()) == [f"test_{n}.parquet" for n in names]
    want = dict(zip(QUESTIONS, golds))
    for name in ("flash", "lists", "pq", "squad"):
        assert _golds(out / f"test_{name}.parquet") == want, name
    assert _golds(out / "test_r1s.parquet") == {q: g[:1] for q, g in want.items()}
    assert {r["data_source"] for r in pq.read_table(out / "test_lists.parquet").to_pylist()} == {"lists"}
    printed = capsys.readouterr().out
    assert ("read r1s/test: question from 'question', golds from 'answer' "
            "(3 rows: a string, read as one gold)") in printed
    assert "read squad/test: question from 'question', golds from 'answers' (3 rows: SQuAD's {text: [...]})" in printed
    assert "read flash/test: question from 'question', golds from 'golden_answers' (3 rows: a list)" in printed


def test_a_subset_of_sources_and_splits(tmp_path, capsys):
    assert _build(tmp_path, "--local-dir", FLASHRAG, "--sources", "hotpotqa", "--splits", "val,test") == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["test_hotpotqa.parquet", "val.parquet"]
    val, test = pq.read_table(out / "val.parquet").to_pylist(), pq.read_table(out / "test_hotpotqa.parquet").to_pylist()
    assert {r["data_source"] for r in val + test} == {"hotpotqa"}
    assert len(val) + len(test) == 8  # the 8-row dev file shared in proportion (500 : 100)
    assert not {r["extra_info"]["source_id"] for r in val} & {r["extra_info"]["source_id"] for r in test}
    assert "in proportion" in capsys.readouterr().err
    assert _build(tmp_path / "x", "--local-dir", FLASHRAG, "--splits", "train,dev") == 1
    assert "error: --splits: dev; choose from train, val, test" in capsys.readouterr().err
    assert _build(tmp_path / "x", "--local-dir", FLASHRAG, "--sources", "bamboogle", "--splits", "train") == 1
    assert "nothing to build: no train draw from sources bamboogle" in capsys.readouterr().err


def test_your_own_train_val_and_test_sets(tmp_path):
    src = tmp_path / "in"
    for split, n in (("train", 4), ("dev", 3), ("test", 2)):
        _jsonl(src / "mine" / f"{split}.jsonl", [{"id": f"{split}{i}", "question": f"{split} question {i}?",
                                                   "answer": f"gold {i}"} for i in range(n)])
    assert _build(tmp_path, "--local-dir", src, "--sources", "mine", "--train-sources", "mine",
                  "--val-sources", "mine") == 0
    out = tmp_path / "out"
    for name, split, n in (("train", "train", 4), ("val", "dev", 3), ("test_mine", "test", 2)):
        rows = pq.read_table(out / f"{name}.parquet").to_pylist()
        assert len(rows) == n and {r["data_source"] for r in rows} == {"mine"}
        assert {r["extra_info"]["source_split"] for r in rows} == {split}


def test_bytes_that_are_not_utf8_are_a_bad_row_named_by_file_and_line(tmp_path, capsys):
    path = tmp_path / "in" / "mine" / "test.jsonl"
    path.parent.mkdir(parents=True)
    good = [json.dumps({"question": q, "answer": "x"}).encode() for q in QUESTIONS]
    path.write_bytes(good[0] + b"\n" + b'{"question": "caf\xe9?", "answer": "x"}\n' + b"\n".join(good[1:]) + b"\n")
    assert _build(tmp_path, "--local-dir", tmp_path / "in", "--sources", "mine", "--splits", "test") == 0
    assert "skipped 1 bad rows of mine/test (not UTF-8: 1 (first at " f"{path} line 2))" in capsys.readouterr().out
    assert len(_golds(tmp_path / "out" / "test_mine.parquet")) == 3
    assert _build(tmp_path, "--local-dir", tmp_path / "in", "--sources", "mine", "--strict") == 1
    assert f"error: {path} line 2: not UTF-8 (byte 0xe9 at column 18) (--strict)" in capsys.readouterr().err


def test_one_row_of_numeric_golds_does_not_retype_the_others(tmp_path, capsys):
    # datasets' json builder inferred one column type for all rows from such a file and dropped all three
    path = _jsonl(tmp_path / "in" / "years" / "test.jsonl",
                  [{"question": QUESTIONS[0], "golden_answers": ["1603"]},
                   {"question": QUESTIONS[1], "golden_answers": [1990]},
                   {"question": QUESTIONS[2], "golden_answers": ["1610", "the year 1610"]}])
    assert _build(tmp_path, "--local-dir", tmp_path / "in", "--sources", "years", "--splits", "test") == 0
    assert _golds(tmp_path / "out" / "test_years.parquet") == {QUESTIONS[0]: ["1603"],
                                                               QUESTIONS[2]: ["1610", "the year 1610"]}
    assert f"golden_answers holds a non-string: 1 (first at {path} line 2)" in capsys.readouterr().out
    assert _build(tmp_path, "--local-dir", tmp_path / "in", "--sources", "years", "--strict") == 1
    assert f"error: {path} line 2: golden_answers holds a non-string (--strict)" in capsys.readouterr().err


def test_bad_source_names_are_refused():
    from data_process.build_qa import SourceArg, parse_sources

    assert parse_sources(["mine", "hotpotqa:dev", "r1=a/b.jsonl"]) == {
        "mine": SourceArg(), "hotpotqa": SourceArg(split="dev"), "r1": SourceArg(path="a/b.jsonl")}
    with pytest.raises(DataBuildError, match=r"'\.\./x' is not NAME, NAME:SPLIT or NAME=PATH"):
        parse_sources(["../x"])
    with pytest.raises(DataBuildError, match=r"'x=' names no file"):
        parse_sources(["x="])


def test_hub_rows_go_through_the_same_reading(tmp_path, monkeypatch, capsys):
    """Without --local-dir the rows come from datasets.load_dataset (here its real json builder on a
    local file, as the hub cannot be reached) and are checked and named like a file's."""
    import datasets

    path = _jsonl(tmp_path / "hub" / "bamboogle.jsonl",
                  [{"id": "b0", "question": QUESTIONS[0], "golden_answers": ["Shakespeare"]},
                   {"id": "b1", "question": "", "golden_answers": ["x"]}])
    real = datasets.load_dataset
    asked = []

    def load_dataset(name, config=None, split=None, cache_dir=None):
        asked.append((name, config, split))
        return real("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert main(["--out-dir", str(tmp_path / "out"), "--sources", "bamboogle", "--splits", "test"]) == 0
    assert asked == [("RUC-NLPIR/FlashRAG_datasets", "bamboogle", "test")]
    assert _golds(tmp_path / "out" / "test_bamboogle.parquet") == {QUESTIONS[0]: ["Shakespeare"]}
    assert "empty question: 1 (first at RUC-NLPIR/FlashRAG_datasets bamboogle/test row 1)" in capsys.readouterr().out


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_a_source_name_given_twice_is_refused_not_dropped(tmp_path, capsys):
    """The first of two raw:SPLIT items used to be dropped silently (500 rows of 2wiki only)."""
    for split in ("hotpotqa_500", "2wiki_500"):
        _jsonl(tmp_path / "in" / "raw" / f"{split}.jsonl", [{"question": q, "answer": "x"} for q in QUESTIONS])
    assert _build(tmp_path, "--local-dir", tmp_path / "in", "--sources", "raw:hotpotqa_500,raw:2wiki_500",
                  "--splits", "test") == 1
    err = capsys.readouterr().err
    assert "error: --sources: source 'raw' is given twice (raw:hotpotqa_500, raw:2wiki_500)" in err
    assert "give each file its own name" in err and not (tmp_path / "out").exists()
    assert _build(tmp_path, "--sources", "a=x.jsonl", "--train-sources", "mine,mine:dev", "--splits", "train") == 1
    assert "error: --train-sources: source 'mine' is given twice" in capsys.readouterr().err


def test_files_in_their_own_layout_keep_their_own_ids(tmp_path, capsys):
    """R1-Searcher's evaluation files (`idx`, `answer`) named as NAME=PATH, and a flat DIR/<name>.jsonl with `id`."""
    r1 = tmp_path / "eval"
    _jsonl(r1 / "hotpotqa_500.jsonl", [{"idx": 100 + i, "question": q, "answer": "x"} for i, q in enumerate(QUESTIONS)])
    _jsonl(r1 / "2wiki_500.jsonl", [{"idx": 7, "question": "Who built it?", "answer": "y"}])
    assert _build(tmp_path, "--sources", f"hotpotqa={r1 / 'hotpotqa_500.jsonl'},2wiki={r1 / '2wiki_500.jsonl'}",
                  "--splits", "test") == 0
    out = tmp_path / "out"
    hot, wiki = _rows(out / "test_hotpotqa.parquet"), _rows(out / "test_2wiki.parquet")
    assert sorted(r["extra_info"]["source_id"] for r in hot) == ["100", "101", "102"]
    assert {r["data_source"] for r in hot} == {"hotpotqa"} and [r["data_source"] for r in wiki] == ["2wiki"]
    assert [r["extra_info"]["source_id"] for r in wiki] == ["7"]
    assert {r["extra_info"]["source_split"] for r in hot} == {"hotpotqa_500.jsonl"}
    assert "read hotpotqa/hotpotqa_500.jsonl: question from 'question'" in capsys.readouterr().out
    # a paper set named by its file: its validation draw reads that file too (not the hub), without overlap
    assert _build(tmp_path / "v", "--sources", f"hotpotqa={r1 / 'hotpotqa_500.jsonl'}", "--splits", "val,test",
                  "--val-size", "1", "--test-size", "2") == 0
    val, test = _rows(tmp_path / "v" / "out" / "val.parquet"), _rows(tmp_path / "v" / "out" / "test_hotpotqa.parquet")
    assert sorted(r["extra_info"]["source_id"] for r in val + test) == ["100", "101", "102"]

    flat = tmp_path / "flat"
    _jsonl(flat / "mine.jsonl", [{"id": f"m{i}", "question": f"question {i}?", "answer": "g"} for i in range(6)])
    assert _build(tmp_path / "f", "--local-dir", flat, "--sources", "mine", "--train-sources", "mine",
                  "--splits", "train,test", "--train-size", "4", "--test-size", "2") == 0
    train, test = _rows(tmp_path / "f" / "out" / "train.parquet"), _rows(tmp_path / "f" / "out" / "test_mine.parquet")
    ids = [r["extra_info"]["source_id"] for r in train + test]
    assert (len(train), len(test)) == (4, 2) and sorted(ids) == [f"m{i}" for i in range(6)]  # one file, no overlap

    assert _build(tmp_path / "g", "--sources", f"gone={tmp_path / 'nope.jsonl'}", "--splits", "test") == 1
    assert f"error: gone={tmp_path / 'nope.jsonl'}: file not found" in capsys.readouterr().err
    assert _build(tmp_path / "g", "--local-dir", flat, "--sources", "other", "--splits", "test") == 1
    err = capsys.readouterr().err
    assert f"{flat / 'other' / 'test.jsonl'}" in err and f"{flat / 'other.jsonl'}" in err and "--sources other=PATH" in err


def test_json_no_file_can_hold_is_a_bad_row_named_by_file_and_line(tmp_path, capsys):
    """A lone surrogate, nesting past the recursion limit and a 5,000-digit number: skipped and counted by
    reason (they were a UnicodeEncodeError, RecursionError or ValueError with no file or line)."""
    path = tmp_path / "in" / "mine" / "test.jsonl"
    path.parent.mkdir(parents=True)
    good = [json.dumps({"question": q, "answer": "x"}) for q in QUESTIONS]
    hostile = ['{"question": "caf\\ud800?", "answer": "x"}', '{"question": "q?", "answer": ["\\udfff"]}',
               '{"question": "q?", "answer": "x", "id": "\\ud800"}',
               '{"question": "q?", "answer": "x", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}",
               '{"question": "q?", "answer": "x", "n": ' + "7" * 5000 + "}"]
    path.write_text("\n".join(good[:1] + hostile + good[1:]) + "\n", encoding="utf-8")
    assert _build(tmp_path, "--local-dir", tmp_path / "in", "--sources", "mine", "--splits", "test") == 0
    out = capsys.readouterr().out
    assert f"lone surrogate: 3 (first at {path} line 2)" in out
    assert f"JSON nested too deeply: 1 (first at {path} line 5)" in out
    assert f"number too long: 1 (first at {path} line 6)" in out
    assert sorted(_golds(tmp_path / "out" / "test_mine.parquet")) == sorted(QUESTIONS)
    assert _build(tmp_path, "--local-dir", tmp_path / "in", "--sources", "mine", "--strict") == 1
    assert (f"error: {path} line 2: lone surrogate (U+D800 in the question at character 4) (--strict)"
            in capsys.readouterr().err)


def test_an_empty_file_is_called_empty(tmp_path, capsys):
    _jsonl(tmp_path / "in" / "blank" / "test.jsonl", [])
    (tmp_path / "in" / "blank" / "test.jsonl").write_text("\n\n")
    (tmp_path / "in" / "none").mkdir()
    pd.DataFrame({"question": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)}).to_parquet(
        tmp_path / "in" / "none" / "test.parquet")
    for name, file in (("blank", "test.jsonl"), ("none", "test.parquet")):
        assert _build(tmp_path, "--local-dir", tmp_path / "in", "--sources", name, "--splits", "test") == 1
        err = capsys.readouterr().err
        assert f"error: {name}/test ({tmp_path / 'in' / name / file}): the file is empty (no rows)" in err, err
