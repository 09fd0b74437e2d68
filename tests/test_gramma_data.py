"""The synthetic graph + questions (kg_synth) and the oracle trajectories for SFT (kg_oracle)."""
import pandas as pd
import pytest

from data_process import kg_oracle, kg_synth
from data_process.schema import validate_row
from gramma.graph import KnowledgeGraph
from verl.trainer.dataset import PromptDataset, to_python
from verl.trainer.sft_data import check_row, tokenize_example

SMALL = ["--countries", "3", "--cities", "5", "--companies", "3", "--teams", "2", "--persons", "16", "--friends", "2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("kg")
    assert kg_synth.main(["--out-dir", str(out), *SMALL]) == 0
    return out


def rows(path):
    return [{k: to_python(v) for k, v in r.items()} for r in pd.read_parquet(path).to_dict("records")]


def test_synth_is_seeded_and_typed(tmp_path, data):
    assert kg_synth.main(["--out-dir", str(tmp_path), *SMALL]) == 0
    assert (tmp_path / "graph" / "triples.jsonl").read_text() == (data / "graph" / "triples.jsonl").read_text()
    g = KnowledgeGraph.load(data / "graph")
    types = {t.relation: (g.entities[t.head].type, g.entities[t.tail].type) for t in g.triples}
    assert types == {"located_in": ("city", "country"), "headquartered_in": ("company", "city"),
                     "based_in": ("team", "city"), "born_in": ("person", "city"), "works_for": ("person", "company"),
                     "plays_for": ("person", "team"), "friend_of": ("person", "person")}
    assert any(t.images for t in g.triples if t.relation == "friend_of")


def test_questions_rows_gold_paths_and_splits(data):
    g = KnowledgeGraph.load(data / "graph")
    starts = {}
    for split in ("train", "val", "test"):
        rs = rows(data / f"{split}.parquet")
        starts[split] = {r["extra_info"]["start"] for r in rs}
        for i, r in enumerate(rs):
            validate_row(r, f"{split} row {i}")
            gt = r["reward_model"]["ground_truth"]
            path, rels = gt["path"], gt["relations"]
            assert path[0] == r["extra_info"]["start"] and len(path) == len(rels) + 1
            for a, b, rel in zip(path, path[1:], rels):  # every gold hop is a real outgoing edge
                assert any(e.outgoing and e.relation == rel for e in g.edges_between(a, b))
            assert g.name(path[-1]) in gt["target"]
            if gt["visual"]:  # exactly one friend's edge shows the attribute
                shown = [e.other for e in g.edges(path[0]) if e.outgoing and e.relation == "friend_of"
                         and any(gt["visual"] in im.attributes for im in e.triple.images)]
                assert shown == [path[1]]
    assert not starts["train"] & starts["test"] and not starts["val"] & starts["test"]
    kinds = {r["data_source"] for r in rows(data / "train.parquet")}
    assert kinds == {"kg_1hop", "kg_2hop", "kg_visual"}


def test_oracle_rows_feed_sft_and_noise_is_worse(tmp_path, data):
    argv = ["--data", str(data / "train.parquet"), "--graph", str(data / "graph"), "--out-dir", str(tmp_path),
            "--n", "120", "--noise", "0.4", "--vocab-size", "600"]
    assert kg_oracle.main(argv) == 0
    out = rows(tmp_path / "oracle.parquet")
    assert len(out) == 120 and len({r["uid"] for r in out}) == 120
    by_mode = {}
    for r in out:
        check_row(r, r["uid"])
        by_mode.setdefault(r["mode"], []).append(r["em"])
    assert set(by_mode["oracle"]) == {1.0} and sum(by_mode["guess"]) < len(by_mode["guess"])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert len(tok("<action>", add_special_tokens=False)["input_ids"]) == 1
    ex = tokenize_example(tok, out[0]["prompt"], out[0]["segments"])
    policy = tok.decode([i for i, m in zip(ex.ids, ex.mask) if m])
    assert policy == "".join(s["text"] for s in out[0]["segments"] if s["by_policy"])
    # The RL data set reads the question files with the same tokenizer.
    ds = PromptDataset([str(data / "val.parquet")], tok, max_prompt_length=512)
    assert len(ds) == len(rows(data / "val.parquet"))


def test_oracle_reports_bad_input(tmp_path, data, capsys):
    argv = ["--data", str(data / "train.parquet"), "--graph", str(tmp_path), "--out-dir", str(tmp_path / "o")]
    assert kg_oracle.main(argv) == 1
    assert "no entities.jsonl" in capsys.readouterr().err
