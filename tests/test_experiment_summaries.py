"""The experiments' summarizers rewrite their committed tables from the committed records byte for byte (run on a
copy, so the records stay as they are); a changed record changes the table."""
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FALLBACK = ROOT / "docs/results/h200/gemma_unseen/fallback"
OFFPOLICY = ROOT / "docs/results/rollout_schedule"


def run(module, *args):
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_gemma_unseen_summary_reproduces_table_and_summary(tmp_path):
    shutil.copytree(FALLBACK.parent, tmp_path / "gemma_unseen")
    here = tmp_path / "gemma_unseen/fallback"
    out = run("experiments.gemma_unseen.summarize", "--dir", here)
    assert (here / "table.txt").read_bytes() == (FALLBACK / "table.txt").read_bytes()
    assert (here / "summary.json").read_bytes() == (FALLBACK / "summary.json").read_bytes()
    assert out == (FALLBACK / "table.txt").read_text() and (here / "fallback.png").stat().st_size > 10_000
    # one draw's seen-listing EM doubled: its row, and only its row, changes
    summary = here / "draws/p3d1/eval_seen/summary.json"
    record = json.loads(summary.read_text())
    record["runs"][0]["overall"]["em"] *= 2
    summary.write_text(json.dumps(record))
    run("experiments.gemma_unseen.summarize", "--dir", here)
    changed = [a for a, b in zip((here / "table.txt").read_text().splitlines(),
                                 (FALLBACK / "table.txt").read_text().splitlines()) if a != b]
    assert len(changed) == 1 and changed[0].startswith("p3d1 ")


def test_rollout_schedule_summary_reproduces_the_cpu_record(tmp_path):
    metrics = OFFPOLICY / "offpolicy_cpu"
    on, off = (next(metrics.glob(f"metrics_{k}_policy.jsonl*")) for k in ("on", "off"))  # plain or gzipped
    out = run("experiments.rollout_schedule.summarize", on, off, "--plot", tmp_path / "offpolicy.png")
    recorded = (OFFPOLICY / "offpolicy_cpu.txt").read_text().splitlines()
    assert out.splitlines()[:-1] == recorded[:-1]  # all but the line naming where the plot went
    assert "speedup off-policy vs on-policy per step: 1.26x" in out
    assert (tmp_path / "offpolicy.png").stat().st_size > 10_000


def test_streaming_summary_reproduces_the_h200_record(tmp_path):
    rec = ROOT / "docs/results/h200/streaming"
    for phase in ("a", "b"):
        shutil.copytree(rec / phase, tmp_path / phase)
    out = run("experiments.streaming.summarize", tmp_path)
    assert (tmp_path / "summary.json").read_bytes() == (rec / "summary.json").read_bytes()
    assert out.splitlines()[:-1] == (rec / "summary.txt").read_text().splitlines()[:-1]  # but the plots' paths


def test_rl_warm_start_summary_reproduces_its_table(tmp_path):
    records = ROOT / "docs/results/rl_warm_start"
    here = tmp_path / "rl_warm_start"
    shutil.copytree(records, here)
    out = run("experiments.rl_warm_start.summarize", "--records", here)
    assert out == (records / "table.md").read_text() == (here / "table.md").read_text()
    assert (here / "summary.json").read_bytes() == (records / "summary.json").read_bytes()
    # the warm start's test EM of one arm halved: that arm's row, and only it, changes
    summary = here / "lr3e-4/eval_summary.json.gz"
    record = json.loads(gzip.decompress(summary.read_bytes()))
    record["runs"][0]["overall"]["em"] /= 2
    summary.write_bytes(gzip.compress(json.dumps(record).encode()))
    run("experiments.rl_warm_start.summarize", "--records", here)
    changed = [a for a, b in zip((here / "table.md").read_text().splitlines(), out.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0].startswith("| lr3e-4 ")


@pytest.mark.parametrize("name,seed2_ppo", [("rl_seeds", "0.747"), ("rl_seeds_200", "0.790")])
def test_rl_seeds_summary_reproduces_its_table(tmp_path, name, seed2_ppo):
    records = ROOT / "docs/results" / name
    here = tmp_path / name
    shutil.copytree(records, here)
    out = run("experiments.rl_seeds.summarize", "--records", here)
    assert out == (records / "table.md").read_text() == (here / "table.md").read_text()
    assert (here / "summary.json").read_bytes() == (records / "summary.json").read_bytes()
    assert (here / "curves.png").stat().st_size > 10_000
    # GRPO seed 2's RL router EM raised: its row, and only it, changes
    summary = here / "grpo_s2/eval_summary.json.gz"
    record = json.loads(gzip.decompress(summary.read_bytes()))
    record["runs"][1]["overall"]["em"] = 0.9
    summary.write_bytes(gzip.compress(json.dumps(record).encode()))
    run("experiments.rl_seeds.summarize", "--records", here)
    changed = [a for a, b in zip((here / "table.md").read_text().splitlines(), out.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0].startswith(f"| 2 | 0.727 | {seed2_ppo} |") and "0.900" in changed[0]
