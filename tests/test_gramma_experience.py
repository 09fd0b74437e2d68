"""Failure diagnosis into the taxonomy, the deduplicated advice bank, and advice in prompts."""
import json

import pytest

from gramma.experience import ExperienceBank, bank_from_records, diagnose, main
from gramma.prompt import INSTRUCTIONS, build_messages, with_advice

TWO_HOP = {"path": ["p", "co", "c"], "relations": ["works_for", "headquartered_in"], "visual": ""}
VISUAL = {"path": ["p", "f"], "relations": ["friend_of"], "visual": "red hat"}


@pytest.mark.parametrize("gt, answer, em, visited, crossed, ev, kind", [
    (TWO_HOP, None, 0.0, ["p"], [], False, "lost"),
    (TWO_HOP, "C", 1.0, ["p", "co"], [], True, None),
    (TWO_HOP, "C", 1.0, ["p", "co"], [], False, "unsupported answer"),
    (TWO_HOP, "X", 0.0, ["p"], [], False, "early stop"),
    (TWO_HOP, "X", 0.0, ["p", "other"], [], False, "wrong entity"),
    (TWO_HOP, "X", 0.0, ["p", "co"], [], False, "wrong relation"),
    (VISUAL, "G", 0.0, ["p"], ["g"], False, "missed visual check"),
    (VISUAL, "G", 0.0, ["p"], ["f", "g"], False, "wrong relation"),
])
def test_diagnosis_taxonomy(gt, answer, em, visited, crossed, ev, kind):
    assert diagnose(gt, answer, em, visited, crossed, ev) == kind


def test_bank_deduplicates_and_counts():
    bank = ExperienceBank()
    for _ in range(3):
        bank.add("early stop", TWO_HOP)
    bank.add("missed visual check", VISUAL)
    bank.add("missed visual check", VISUAL)
    bank.add("early stop", {"relations": ["born_in", "located_in"]})
    bank.add(None, TWO_HOP)
    assert bank.kinds == {"early stop": 4, "missed visual check": 2}
    assert bank.top(2) == ["Follow every hop the question needs (works_for then headquartered_in) before STOP. "
                           "(seen 3 times)",
                           "Use CROSS_MODAL on the candidates before saying what a picture shows. (seen 2 times)"]
    assert ExperienceBank.from_json(json.loads(json.dumps(bank.to_json()))).top(5) == bank.top(5)
    with pytest.raises(ValueError, match="unknown failure class"):
        bank.add("bad luck", TWO_HOP)


def test_advice_goes_into_the_system_prompt():
    base = build_messages("Q?", "Ana")
    m = with_advice(base, ["Do X (seen 2 times)"])
    assert m[0]["content"].startswith(INSTRUCTIONS) and m[0]["content"].endswith("- Do X (seen 2 times)")
    assert m[1] == base[1] and base[0]["content"] == INSTRUCTIONS  # the input is not modified
    assert build_messages("Q?", "Ana", ["Do X (seen 2 times)"]) == m
    with pytest.raises(ValueError, match="GraMMA system instructions"):
        with_advice([{"role": "user", "content": "hi"}], ["x"])


def test_cli_builds_the_bank_from_evaluation_records(tmp_path, capsys):
    recs = [{"gt": TWO_HOP, "answer": None, "em": 0.0, "visited": [], "cross_checked": [], "evidence_ok": False},
            {"gt": VISUAL, "answer": "G", "em": 0.0, "visited": ["p"], "cross_checked": [], "evidence_ok": False}]
    path = tmp_path / "traj.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert main(["--trajectories", str(path), "--out", str(tmp_path / "advice.json")]) == 0
    out = json.loads((tmp_path / "advice.json").read_text())
    assert out["kinds"] == {"lost": 1, "missed visual check": 1} and len(out["top"]) == 2
    path.write_text(json.dumps({"gt": TWO_HOP}) + "\n")
    assert main(["--trajectories", str(path), "--out", str(tmp_path / "a2.json")]) == 1
    assert "record 0: missing field" in capsys.readouterr().err
    assert bank_from_records([]).top() == []


def test_bank_keeps_advice_per_question_kind():
    bank = bank_from_records([
        {"kind": "kg_2hop", "gt": TWO_HOP, "answer": "X", "em": 0.0, "visited": ["p"], "cross_checked": [],
         "evidence_ok": False},
        {"kind": "kg_visual", "gt": VISUAL, "answer": "G", "em": 0.0, "visited": ["p"], "cross_checked": [],
         "evidence_ok": False},
        {"kind": "kg_visual", "gt": VISUAL, "answer": "G", "em": 0.0, "visited": ["p"], "cross_checked": ["g"],
         "evidence_ok": False}])
    assert bank.top(1, "kg_visual") == ["Use CROSS_MODAL on the candidates before saying what a picture shows. "
                                        "(seen 2 times)"]
    assert bank.top(3, "kg_2hop") == ["Follow every hop the question needs (works_for then headquartered_in) "
                                      "before STOP. (seen 1 times)"]
    assert bank.top(3, "kg_1hop") == []  # no failures seen on that kind: no advice
    assert ExperienceBank.from_json(json.loads(json.dumps(bank.to_json()))).top(3, "kg_visual") == \
        bank.top(3, "kg_visual")


def test_cli_writes_questions_with_advice(tmp_path):
    import pandas as pd

    from data_process.kg_synth import SynthConfig, build

    build(SynthConfig(out_dir=tmp_path / "d", persons=40, cities=8, companies=5, teams=3, countries=3))
    bank = ExperienceBank()
    bank.add("missed visual check", VISUAL, "kg_visual")
    bank.add("early stop", TWO_HOP, "kg_2hop")
    bank.add("early stop", TWO_HOP, "kg_2hop")
    (tmp_path / "bank.json").write_text(json.dumps(bank.to_json()))
    src = tmp_path / "d" / "test.parquet"
    for per_kind, out in ((True, tmp_path / "per.parquet"), (False, tmp_path / "all.parquet")):
        args = ["--bank", str(tmp_path / "bank.json"), "--data", str(src), "--out", str(out), "--top", "1"]
        assert main(args + (["--per-kind"] if per_kind else [])) == 0
    before, per, glob = (pd.read_parquet(p) for p in (src, tmp_path / "per.parquet", tmp_path / "all.parquet"))
    assert len(before) == len(per) == len(glob) > 0
    for b, x, y in zip(before.to_dict("records"), per.to_dict("records"), glob.to_dict("records")):
        assert list(x["prompt"])[1] == list(b["prompt"])[1]  # the question is untouched
        sys_per, sys_all = x["prompt"][0]["content"], y["prompt"][0]["content"]
        assert sys_all.endswith("before STOP. (seen 2 times)")
        if x["data_source"] == "kg_visual":
            assert sys_per.endswith("what a picture shows. (seen 1 times)")
        elif x["data_source"] == "kg_2hop":
            assert sys_per == sys_all
        else:
            assert sys_per == b["prompt"][0]["content"] == INSTRUCTIONS
