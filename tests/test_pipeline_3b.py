"""experiments/pipeline_3b: run.sh end to end at the tiny shape on CPU (both schedules against the simulated pool),
the summary's figures against the metrics it read, and the summarizer's errors on missing or malformed files."""
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.pipeline_3b import summarize as s
from experiments.pipeline_3b.build import action_texts

ROOT = Path(__file__).resolve().parents[1]
SKIP = 1
TINY = {"SHAPE": "tiny", "DEVICE": "cpu", "COMPILE": "0", "STEPS": "3", "SKIP": str(SKIP), "BATCH": "4",
        "TURN": "24", "MAX_RESPONSE": "96", "LATENCY": "0.2", "N_ORACLE": "60", "TRAIN_SIZE": "100"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline_3b")
    env = {**os.environ, **TINY, "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "experiments/pipeline_3b/run.sh", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout


def training_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "timing/step" in r]


def test_the_summary_counts_the_trained_tokens_the_metrics_hold_and_its_split_fits_in_the_step(tiny_run):
    out, stdout = tiny_run
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["runs"]) == ["stream", "sync"] and not summary["errors"]
    assert "Tokens counted: batch/tokens" in (out / "summary.md").read_text() and "| sync |" in stdout
    for name, r in summary["runs"].items():
        rows = training_rows(out / name / "metrics.jsonl")
        # stopped at STEPS, before the last (saving) step; one more may finish while the stop is on its way
        assert len(rows) in (3, 4)
        counted = rows[SKIP:3]
        assert r["counted_steps"] == [2, 3]
        assert r["tokens"] == sum(x["batch/tokens"] for x in counted)
        assert r["prompt_tokens"] == sum(x["batch/prompt_tokens"] for x in counted) < r["tokens"]
        assert r["tokens_per_s_per_gpu"] == pytest.approx(statistics.fmean(
            x["batch/tokens"] / x["timing/step"] for x in counted))
        split, step = r["split_s"], r["step_s"]
        assert step == pytest.approx(statistics.fmean(x["timing/step"] for x in counted))
        rollout = split["weight_sync"] + split["decode"] + split["pool_wait"]
        train = sum(split[k] for k, _ in s.TRAIN)
        assert all(v >= -1e-9 for v in split.values())
        assert rollout <= split["rollout_wait"] + 1e-9 and split["rollout_wait"] + train <= step + 1e-9
        assert split["rollout_wait"] + train + split["train_other"] + split["step_other"] == pytest.approx(step)
        assert sum(x["route_count/mean"] for x in rows) > 0  # the action tokens made the random policy route
    assert summary["model"]["shape"] == "tiny" and not list(out.glob("*/checkpoints"))


def row(step, tokens=1000.0, step_s=2.0, **over):
    r = {"step": step, "timing/step": step_s, "batch/tokens": tokens, "batch/prompt_tokens": 400.0,
         "batch/episodes": 4.0, "timing/rollout_wait": 1.0, "timing/train": 0.9, "timing/weight_sync": 0.1,
         "timing/decode": 0.5, "timing/env_wait": 0.3, "timing/old_log_prob": 0.1, "timing/ref": 0.1,
         "timing/values": 0.1, "timing/adv": 0.0, "timing/update_critic": 0.2, "timing/update_actor": 0.3}
    r.update(over)
    return r


def write(path: Path, lines: list[str], end: str = "\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + end)


def test_the_figures_follow_the_rows_and_a_cut_last_line_is_dropped(tmp_path):
    rows = [row(1, 10.0, 100.0), row(2, 1000.0, 2.0), row(3, 3000.0, 4.0)]
    write(tmp_path / "sync" / "metrics.jsonl", [json.dumps(r) for r in rows] + ['{"step": 4, "timing/st'], end="")
    summary = s.summarize(tmp_path, ["sync"], skip=1, gpus=2)
    r = summary["runs"]["sync"]
    assert r["counted_steps"] == [2, 3] and r["tokens"] == 4000
    assert r["tokens_per_s_per_gpu"] == pytest.approx((500 + 750) / 2 / 2)
    assert r["tokens_per_s_per_gpu_pooled"] == pytest.approx(4000 / 6 / 2)
    assert r["split_s"]["rollout_other"] == pytest.approx(0.1) and r["split_s"]["step_other"] == pytest.approx(1.1)
    assert s.summarize(tmp_path, ["sync"], skip=1, gpus=2, steps=2)["runs"]["sync"]["counted_steps"] == [2]


@pytest.mark.parametrize("lines, why", [
    (None, "sync/metrics.jsonl: no such metrics file"),
    ([json.dumps(row(1)), "not json", json.dumps(row(2))], "sync/metrics.jsonl:2: not a JSON line"),
    ([json.dumps(row(1)), "[1, 2]"], "sync/metrics.jsonl:2: a metrics row must be a JSON object"),
    ([json.dumps(row(1)), json.dumps({k: v for k, v in row(2).items() if k != "batch/tokens"})],
     "sync/metrics.jsonl:2 \\(step 2\\): no number for batch/tokens"),
    ([json.dumps(row(1))], "sync/metrics.jsonl: 1 training steps; the summary skips the first 1, none is left"),
])
def test_a_missing_or_malformed_metrics_file_is_an_error_naming_it(tmp_path, capsys, lines, why):
    if lines is not None:
        write(tmp_path / "sync" / "metrics.jsonl", lines)
    write(tmp_path / "stream" / "metrics.jsonl", [json.dumps(row(k)) for k in (1, 2)])
    assert s.main([str(tmp_path), "--runs", "sync", "stream", "--skip", "1"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert re.search(why, err), err
    assert "stream" in json.loads((tmp_path / "summary.json").read_text())["runs"]  # the sound run is still summarised


def test_action_tokens_are_distinct_routes_and_answers():
    texts = action_texts(["A", "B"], ["q1?"], 9)
    assert len(set(texts)) == 9 and sum(t.startswith("<answer>") for t in texts) == 2
    assert texts[:3] == ["<search>A: q1?</search>", "<search>B: q1?</search>", "<search>A: q1? (1)</search>"]
