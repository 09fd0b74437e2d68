"""docs/usage.md's "Your own QA files" commands, run as written on a tiny trained run: every one that fits on CPU (the
paper run's line calls a real pool's endpoints). Each runs in a directory laid out as the commands expect
(DIR/<name>/<split>.jsonl, outputs/embedded as bash train.sh leaves it, a Search-R1 parquet) beside a copy of
test.sh, which works from its own directory."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from own_qa_run import tiny_run
from serve_fixture import ANSWER, BIG

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = {"What is the capital of Veloria?": ANSWER, "Which city hosts the Veloria court?": ANSWER,
             "Who wrote Hamlet?": "Shakespeare"}


def documented_commands() -> list[str]:
    """The shell commands of the section's bash block, continuation lines joined."""
    text = (REPO / "docs" / "usage.md").read_text()
    section = text[text.index("### Your own QA files"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def lay_out(root: Path, trained_router: Path) -> None:
    shutil.copy(REPO / "test.sh", root / "test.sh")
    tiny_run(trained_router, root / "outputs" / "embedded", conditioned=False)
    for name, split in (("mine", "dev"), ("hotpotqa", "dev")):
        (root / "DIR" / name).mkdir(parents=True)
        (root / "DIR" / name / f"{split}.jsonl").write_text("".join(
            json.dumps({"id": f"{name}-{i}", "question": q, "answer": a}) + "\n"
            for i, (q, a) in enumerate(QUESTIONS.items())))
    (root / "nq_search").mkdir()
    pd.DataFrame([{"id": f"test_{i}", "question": q, "golden_answers": [a], "data_source": "nq",
                   "prompt": [{"role": "user", "content": f"Answer the given question. Question: {q}\n"}],
                   "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": [a]}},
                   "extra_info": {"split": "test", "index": i}}
                  for i, (q, a) in enumerate(QUESTIONS.items())]).to_parquet(root / "nq_search" / "test.parquet")


def test_the_own_qa_commands_run_as_written(trained_router, tmp_path):
    lay_out(tmp_path, trained_router)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    ran, skipped = [], []
    for command in documented_commands():
        if "configs/pool/paper.yaml" in command:  # the paper run's endpoints
            skipped.append(command)
            continue
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        ran.append((command, proc.stdout))
    assert len(ran) == 3 and len(skipped) == 1 and "outputs/router_r1" in skipped[0]

    evals = sorted((tmp_path / "outputs" / "eval").iterdir())
    assert len(evals) == 2  # one directory each
    for (command, stdout), out in zip(ran[1:], evals):
        summary = json.loads((out / "summary.json").read_text())
        assert summary["config"]["checkpoints"] == ["outputs/embedded/hf"]
        assert "rebuilt from their questions" in stdout  # the run's own template, taken by itself
        records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
        # the router routes and answers as trained: its template, not the rows' prompts
        assert all(r["format_ok"] and r["models_called"] == [BIG] for r in records), records
        assert [r["em"] for r in records if r["golds"] == [ANSWER]] == [1.0] * (2 * len(records) // 3)
        ids = [r["source_id"] for r in records]
        if "nq_search" in command:
            assert ids == ["test_0", "test_1", "test_2"]
        else:  # the input files' ids, through build_qa
            assert sorted(ids) == sorted(f"{n}-{i}" for n in ("mine", "hotpotqa") for i in range(3))
