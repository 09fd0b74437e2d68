"""Paired comparison of two evaluations: per-kind EM, bootstrap interval, exact McNemar."""
import json

import numpy as np
import pytest

from gramma.compare import compare, main, mcnemar_p, paired


def test_mcnemar_exact_values():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)  # all 5 discordant pairs one way
    assert mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(10, 2) == pytest.approx(2 * sum(__import__("math").comb(12, i) for i in range(3)) / 4096)


def test_paired_interval_excludes_zero_only_for_a_real_gain():
    rng = np.random.default_rng(1)
    base = (rng.random(300) < 0.5).astype(float)
    better = base.copy()
    better[np.flatnonzero(base == 0)[:60]] = 1.0  # 60 more right, none lost
    s = paired(base, better)
    assert s["diff"] == pytest.approx(0.2) and s["wins"] == 60 and s["losses"] == 0
    assert s["ci95"][0] > 0 and s["mcnemar_p"] < 1e-10
    same = paired(base, base)
    assert same["diff"] == 0 and same["ci95"] == [0.0, 0.0] and same["mcnemar_p"] == 1.0
    with pytest.raises(ValueError):
        paired(base, better[:10])


def test_cli_compares_per_kind(tmp_path, capsys):
    def write(name, ems):
        recs = [{"uid": f"q{i}", "kind": "kg_visual" if i < 4 else "kg_1hop", "em": e} for i, e in enumerate(ems)]
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    write("a.jsonl", [0, 0, 0, 0, 1, 1])
    write("b.jsonl", [1, 1, 0, 0, 1, 0])
    assert main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--out", str(tmp_path / "c.json")]) == 0
    out = json.loads((tmp_path / "c.json").read_text())
    assert out["kg_visual"]["diff"] == 0.5 and out["kg_1hop"]["diff"] == -0.5
    assert (out["all"]["wins"], out["all"]["losses"]) == (2, 1)
    assert "| kg_visual | 4 | 0.000 | 0.500 |" in capsys.readouterr().out
    write("c.jsonl", [1, 1, 0])
    assert main([str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl")]) == 1
    assert "different questions" in capsys.readouterr().err
    with pytest.raises(ValueError):
        compare({"q": {"kind": "k", "em": 1}}, {"r": {"kind": "k", "em": 1}})
