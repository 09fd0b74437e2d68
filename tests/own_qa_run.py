"""A tiny trained run laid out as `bash train.sh` leaves it, for the own-QA-file tests.

RUN/ppo/hf is the export (model, tokenizer, prompt_template.txt, run_config.yaml), RUN/ppo/run_config.yaml
the trainer's copy, RUN/hf the copy test.sh and infer.py load by default. The model is serve_fixture's tiny
router: it always routes one sub-question to the dearest sim model, then answers serve_fixture.ANSWER.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml


def tiny_run(trained_hf: Path, run: Path, conditioned: bool = True) -> Path:
    """RUN from the trained router's HF dir; without `conditioned`, its run config trains at one alpha (no
    env.alphas), so evaluation prompts it with the rows' questions and its own template."""
    export = run / "ppo" / "hf"
    shutil.copytree(trained_hf, export)
    config = yaml.safe_load((export / "run_config.yaml").read_text())
    if not conditioned:
        config["env"].pop("alphas", None)
        (export / "run_config.yaml").write_text(yaml.safe_dump(config))
    shutil.copy(export / "run_config.yaml", run / "ppo" / "run_config.yaml")
    shutil.copytree(export, run / "hf")
    return run
