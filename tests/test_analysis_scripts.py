"""Smoke runs of the analysis scripts (scripts/) on the records under docs/results, as their run.sh files call them."""
import json
import subprocess
import sys
from pathlib import Path

from router_r1.pool.sim_world import SimWorld

ROOT = Path(__file__).resolve().parents[1]
EMB, ADA = ROOT / "docs/results/embedded_cpu", ROOT / "docs/results/adaturn_cpu"


def script(name, *args):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_plot_runs(tmp_path):
    script("plot_runs.py", "--run", f"alpha 0={EMB / 'ppo_metrics.jsonl'}",
           "--run", f"alpha 0.6={EMB / 'alpha06_ppo_metrics.jsonl'}", "--out", tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_eval_table():
    out = script("eval_table.py", EMB / "eval_summary.json", EMB / "alpha06_eval_summary.json")
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len(rows) >= 4 and "---" in rows[1]


def test_adaturn_modes(tmp_path):
    script("adaturn_modes.py", "--budgets", ADA / "budgets.json", "--metrics", f"forced={ADA / 'v2_grpo_metrics.jsonl'}",
           "--out", tmp_path)
    assert {"modes.json", "modes.png", "modes_curves.png"} <= {p.name for p in tmp_path.iterdir()}


def test_diagnose_failures(tmp_path):
    """Two runs over the same questions: one asks each hop and copies the reply, one answers unasked."""
    qs = SimWorld(seed=0).questions(6, seed=1, split="test", two_hop_frac=0.5)
    recs = []
    for q in qs:
        turns = [{"action": "route", "ok": True, "model": "Mixtral-8x22B-Instruct", "query": h.sub_question,
                  "information": f"{h.answer}."} for h in q.hops]
        common = {"uid": q.uid, "question": q.question, "golds": q.answers, "data_source": "sim", "format_ok": True}
        recs.append({**common, "run": "guess", "em": 0.0, "turns": []})
        recs.append({**common, "run": "routed", "em": 1.0, "turns": turns})
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = script("diagnose_failures.py", path)
    assert "== guess: 6 questions, EM 0.000" in out and "no_route 6" in out
    assert "won 6" in out and "EM difference +1.000" in out
