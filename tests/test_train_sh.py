"""`bash train.sh`, shortened: every stage of the embedded default runs for real.

Oracle data, tokenizer, SFT (a few hundred steps), the simulated pool server started by
the script, two PPO steps against it, and the final evaluation. Checks that metrics are
produced and finite and that the trajectories hold real pool calls.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import yaml

from verl.trainer.tracking import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


def test_shortened_embedded_default(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "N_ORACLE": "600", "SFT_EPOCHS": "8",
           "SFT_MAX_STEPS": "300", "EVAL_LIMIT": "24", "OMP_NUM_THREADS": "2",
           "EVAL_BASELINES": "oracle single:Mixtral-8x22B"}  # "all" by default; knn/mlp are tested elsewhere
    overrides = ["trainer.total_steps=2", "trainer.test_freq=0", "data.train_batch_size=16",
                 "actor.ppo_mini_batch_size=16", "critic.ppo_mini_batch_size=16", "data.val_limit=24",
                 "critic.warmup_steps=0"]
    # a guard against a hang, not a speed check: it took 150 s on 2 idle cores and 1,300 s at load 10
    proc = subprocess.run(["bash", "train.sh", *overrides], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=2400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    rows = {r["step"]: r for r in read_jsonl(tmp_path / "ppo" / "metrics.jsonl")}
    assert sorted(rows) == [0, 1, 2]
    for step in (1, 2):
        for key in ("reward/mean", "em/mean", "cost_usd/mean", "route_count/mean", "actor/pg_loss",
                    "critic/vf_loss", "format_ok/mean", "part/think/adv", "part/think/value"):
            assert math.isfinite(rows[step][key]), (step, key)
    assert (tmp_path / "ppo" / "curves.png").stat().st_size > 0
    # env.schedule=auto: the hf loop on the CPU plays each turn as one batch
    assert "env.schedule=auto plays sync" in proc.stdout + proc.stderr

    # Real pool calls: priced replies from the simulated server inside the trajectories.
    records = [json.loads(line) for line in (tmp_path / "eval" / "trajectories.jsonl").read_text().splitlines()]
    calls = [t for r in records for t in r["turns"] if t.get("action") == "route" and t.get("ok")]
    assert calls, "no trajectory called the pool"
    assert all(t["cost_usd"] > 0 and t["information"] for t in calls)
    assert any(rows[s]["route_count/mean"] > 0 for s in (1, 2)), "PPO rollouts made no pool call"
    assert (tmp_path / "hf" / "prompt_template.txt").exists()
    # the default world and seeds, as before WORLD_SEED, POOL and SEED: world 0, sim.yaml, annotator 0, SFT 1/0/0, PPO 1
    assert (tmp_path / "world.env").read_text() == "WORLD_SEED=0\nPOOL=configs/pool/sim.yaml\n"
    assert "build.seed=" not in proc.stdout and "build.world_seed=" not in proc.stdout
    sft, ppo = (yaml.safe_load((tmp_path / d / "run_config.yaml").read_text()) for d in ("sft", "ppo"))
    assert (sft["trainer"]["seed"], sft["data"]["seed"], sft["model"]["seed"]) == (1, 0, 0)
    assert (ppo["trainer"]["seed"], ppo["env"]["sim_seed"], ppo["env"]["pool"]) == (1, 0, "configs/pool/sim.yaml")
    assert all(r["extra_info"]["source_id"].startswith("sim0-") for r in read_parquet_rows(tmp_path / "data" / "test.parquet"))
    # the router beside the baselines, labelled by how it was trained, each baseline paired with it
    runs = json.loads((tmp_path / "eval" / "summary.json").read_text())["runs"]
    assert [r["label"] for r in runs] == ["SFT router", f"PPO router ({tmp_path.name})", "oracle",
                                          "single:Mixtral-8x22B-Instruct"]
    assert runs[2]["vs_router"]["reference"] == f"PPO router ({tmp_path.name})"
    assert "Paired against the router" in proc.stdout and "where EM is lost" in proc.stdout

    # test.sh with only a checkpoint evaluates with the shape that checkpoint trained with (its run_config.yaml)
    proc = subprocess.run(["bash", "test.sh", "--checkpoint", str(tmp_path / "hf"), "--data",
                           str(tmp_path / "data" / "test.parquet"), "--limit", "4", "--out", str(tmp_path / "eval4")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    shape = json.loads((tmp_path / "eval4" / "summary.json").read_text())["config"]
    assert (shape["max_turns"], shape["max_obs_length"], shape["response_length"], shape["max_response_length"],
            shape["schedule"], shape["alpha"]) == (3, 128, 64, 512, "auto", 0.0)

    # The default annotator sends each hop to its domain's cheap specialist, with a few random slips:
    # neither the cautious habit (all to the dearest generalist) nor the people/science mix-up.
    modes = [r["mode"] for r in read_parquet_rows(tmp_path / "oracle" / "oracle.parquet")]
    assert 0.85 < modes.count("oracle") / len(modes) < 1.0
    assert modes.count("big") == modes.count("confused") == 0

    # An alpha run from the same warm start: stages 1-3 reused, the evaluation scored with alpha 0.6.
    alpha_out = tmp_path / "alpha06"
    env06 = {**env, "OUT": str(alpha_out), "SFT_FROM": str(tmp_path)}  # the evaluation reads alpha from the run
    overrides06 = [o for o in overrides if not o.startswith("trainer.total_steps")] + ["trainer.total_steps=1",
                                                                                      "env.alpha=0.6"]
    proc = subprocess.run(["bash", "train.sh", *overrides06], cwd=ROOT, env=env06, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "stages 1-3 reused" in proc.stdout and not (alpha_out / "sft").exists()
    summary = json.loads((alpha_out / "eval" / "summary.json").read_text())
    assert summary["config"]["alpha"] == 0.6
    assert summary["config"]["checkpoints"] == [str(tmp_path / "sft"), str(alpha_out / "hf")]
    assert sorted(r["step"] for r in read_jsonl(alpha_out / "ppo" / "metrics.jsonl")) == [0, 1]


def read_parquet_rows(path):
    import pandas as pd

    return pd.read_parquet(path).to_dict("records")


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python in train.sh: records each command, makes the files the next stage reads, runs -c for real.
echo "$*" >> "$OUT/commands.log"
case "$*" in
  -c*) exec {python} "$@" ;;
  *sim.warm_start*) mkdir -p "$OUT/oracle" && touch "$OUT/oracle/prompt_template.txt" ;;
  *"--config-name sft"*) mkdir -p "$OUT/sft" && printf '%s' "$SUMMARY" > "$OUT/sft/sft_summary.json" ;;
esac
"""


def _train_sh_sft_only(tmp_path, summary: dict, **env):
    """train.sh SFT_ONLY=1 with the fake python (an env value of None unsets it); its output and SFT command."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(tmp_path / "out"), "SFT_ONLY": "1",
           "SUMMARY": json.dumps(summary), **env}
    proc = subprocess.run(["bash", "train.sh"], cwd=ROOT, env={k: v for k, v in env.items() if v is not None},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sft = [line for line in (tmp_path / "out" / "commands.log").read_text().splitlines() if "--config-name sft" in line]
    return proc, sft[0]


def _stage1(tmp_path, **env):
    """The recipe train.sh's stage 1 builds under `env` (its sim.warm_start command, parsed)."""
    from sim.warm_start.recipe import parse_args

    tmp_path.mkdir()
    _train_sh_sft_only(tmp_path, {"steps": 1, "planned_steps": 1, "stopped": "done"}, **env)
    (line,) = [x for x in (tmp_path / "out" / "commands.log").read_text().splitlines()
               if x.startswith("-m sim.warm_start")]  # not the -c that reads the recipe's pool
    args = line.split()
    assert args[:2] == ["-m", "sim.warm_start"] and "--report" in args
    return parse_args(args[2:])


def test_stage_one_builds_the_default_recipe_and_the_knobs_override_it(tmp_path):
    recipe = _stage1(tmp_path / "default")
    assert recipe.build.n == 2000 and recipe.build.out_dir == str(tmp_path / "default" / "out" / "oracle")
    # the old defaults: --noise 0.05 --prefer-big 0 --confuse 0 --rename 1 --whole-names
    assert (recipe.build.noise, recipe.habits.prefer_big, recipe.habits.confuse, recipe.names.rename,
            recipe.names.whole_names) == (0.05, 0.0, 0.0, 1.0, True)
    knobs = _stage1(tmp_path / "knobs", NOISE="0.2", PREFER_BIG="0.3", CONFUSE="0.8", RENAME="0", WHOLE_NAMES="0",
                    N_ORACLE="64")
    assert (knobs.build.n, knobs.build.noise, knobs.habits.prefer_big, knobs.habits.confuse, knobs.names.rename,
            knobs.names.whole_names) == (64, 0.2, 0.3, 0.8, 0.0, False)
    earlier = _stage1(tmp_path / "earlier", RECIPE="configs/recipes/confused.yaml")
    assert (earlier.build.noise, earlier.habits.prefer_big, earlier.habits.confuse) == (0.2, 0.3, 0.8)


def test_the_embedded_default_has_a_step_budget_not_a_clock(tmp_path):
    """A slow machine trains the same warm start as a fast one: no SFT time limit unless one is asked for."""
    done = {"steps": 750, "planned_steps": 750, "stopped": "done"}
    proc, sft = _train_sh_sft_only(tmp_path, done, SFT_TIME_LIMIT=None)
    assert "trainer.time_limit_s=null" in sft and "trainer.total_epochs=6" in sft
    assert "WARNING" not in proc.stdout + proc.stderr


def test_a_warm_start_cut_by_a_time_limit_is_said_on_the_console_and_in_the_last_line(tmp_path):
    cut = {"steps": 632, "planned_steps": 750, "stopped": "time limit 900s"}
    proc, sft = _train_sh_sft_only(tmp_path, cut, SFT_TIME_LIMIT="900")
    assert "trainer.time_limit_s=900" in sft
    note = "SFT stopped early at step 632 of 750 (time limit 900s)"
    assert f"WARNING: {note}" in proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].endswith(f"done: SFT model {tmp_path / 'out' / 'sft'} - WARNING: {note}")


def other_pool(path: Path) -> Path:
    """configs/pool/sim.yaml with the cheap specialists' domains rotated and their prices changed: the oracle's
    pick for each domain, and the prompts' listing, differ from the default pool's."""
    doc = yaml.safe_load((ROOT / "configs" / "pool" / "sim.yaml").read_text())
    specs = {m["name"]: m for m in doc["models"]}
    for name, domains, price in (("Qwen2.5-7B-Instruct", ("geography", "sports"), 0.25),
                                 ("LLaMA-3.1-8B-Instruct", ("people", "arts"), 0.40),
                                 ("Mistral-7B-Instruct", ("science", "business"), 0.10)):
        acc = {"default": specs[name]["sim"]["accuracy"]["default"], **{d: 0.95 for d in domains}}
        specs[name]["sim"]["accuracy"] = acc
        specs[name]["price_out_per_m"] = specs[name]["price_in_per_m"] = price
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_world_seed_pool_and_seed_reach_every_stage(tmp_path):
    """WORLD_SEED, POOL and SEED on a shrunk real run: the annotator, the data, the pool server, PPO and the
    evaluation all use world 3 and the other pool, and each stage its seed; a world or pool left behind by one of
    them shows as the oracle routing questions the server cannot answer."""
    pool = other_pool(tmp_path / "rotated.yaml")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "OMP_NUM_THREADS": "2", "WORLD_SEED": "3",
           "POOL": str(pool), "SEED": "2", "N_ORACLE": "200", "SFT_MAX_STEPS": "2", "EVAL_LIMIT": "24",
           "EVAL_BASELINES": "oracle-hops", "TRAIN_SIZE": "300"}
    overrides = ["trainer.total_steps=1", "trainer.test_freq=0", "data.train_batch_size=8",
                 "actor.ppo_mini_batch_size=8", "critic.ppo_mini_batch_size=8", "data.val_limit=8",
                 "critic.warmup_steps=0"]
    proc = subprocess.run(["bash", "train.sh", *overrides], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)  # a hang guard: about 60 s on 2 idle cores
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (out / "world.env").read_text() == f"WORLD_SEED=3\nPOOL={pool}\n"

    # the annotator: world 3, the rotated pool (science goes to Mistral now), its seed SEED - 1
    assert "build.seed=1" in proc.stdout and "build.world_seed=3" in proc.stdout
    rows = read_parquet_rows(out / "oracle" / "oracle.parquet")
    science = [r for r in rows if r["mode"] == "oracle" and r["domain"] == "science" and r["data_source"] == "sim_1hop"]
    assert science and all(r["route_models"][0] == "Mistral-7B-Instruct" for r in science)
    assert sum(r["em"] for r in rows) / len(rows) > 0.8
    # the data: world 3's questions, prompts listing the rotated pool's prices
    for split, n in (("train", 300), ("val", 100), ("test", 300)):  # TRAIN_SIZE sets the training questions
        data = read_parquet_rows(out / "data" / f"{split}.parquet")
        assert len(data) == n and all(r["extra_info"]["source_id"].startswith("sim3-") for r in data), split
        assert "Mistral-7B-Instruct $0.10" in data[0]["prompt"][-1]["content"]
    # SFT and PPO: their seeds, and PPO's env on the same pool and world
    sft = yaml.safe_load((out / "sft" / "run_config.yaml").read_text())
    assert (sft["trainer"]["seed"], sft["data"]["seed"], sft["model"]["seed"]) == (2, 1, 1)
    ppo = yaml.safe_load((out / "ppo" / "run_config.yaml").read_text())
    assert (ppo["trainer"]["seed"], ppo["env"]["sim_seed"], ppo["env"]["pool"]) == (2, 3, str(pool))
    # the pool server answers world 3's questions as the rotated pool's experts: the oracle that asks each hop's
    # specialist (read from the same world and pool) gets them right; a server on world 0 or on sim.yaml would not
    summary = json.loads((out / "eval" / "summary.json").read_text())
    assert (summary["config"]["pool"], summary["config"]["sim_seed"]) == (str(pool), 3)
    (oracle,) = [r for r in summary["runs"] if r["label"] == "oracle-hops"]
    assert oracle["overall"]["em"] > 0.8 and oracle["overall"]["pool_calls"] > 0
    assert oracle["overall"]["call_share"].get("Mistral-7B-Instruct", 0) > 0


def test_sft_from_refuses_another_world_and_bad_values(tmp_path):
    """A reused warm start belongs to its world: another WORLD_SEED or POOL is refused before any stage runs."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "world.env").write_text("WORLD_SEED=3\nPOOL=configs/pool/sim.yaml\n")
    base = {**os.environ, "OUT": str(tmp_path / "out"), "SFT_FROM": str(src)}
    for extra, words in (({"WORLD_SEED": "0"}, "WORLD_SEED=0, but SFT_FROM"),
                         ({"POOL": "configs/pool/sim_tradeoff.yaml"}, "POOL=configs/pool/sim_tradeoff.yaml, but"),
                         ({"SEED": "0"}, "SEED must be an integer >= 1"),
                         ({"WORLD_SEED": "x", "SFT_FROM": ""}, "WORLD_SEED must be an integer"),
                         ({"POOL": "nonesuch.yaml", "SFT_FROM": ""}, "POOL=nonesuch.yaml: no such file")):
        proc = subprocess.run(["bash", "train.sh"], cwd=ROOT, env={**base, **extra}, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and words in proc.stderr, (extra, proc.stderr[-500:])
        assert not (tmp_path / "out" / "ppo").exists() and not (tmp_path / "out" / "oracle").exists()


def test_pool_defaults_to_the_recipes_pool(tmp_path):
    """Without POOL a recipe's own pool (alpha.yaml: sim_tradeoff.yaml) is the run's, as before POOL existed;
    POOL overrides it. The run stops at stage 1 here (NOISE=2 is refused), after saying its world."""
    for extra, pool in (({}, "configs/pool/sim_tradeoff.yaml"),
                        ({"POOL": "configs/pool/sim_unseen.yaml"}, "configs/pool/sim_unseen.yaml")):
        env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "RECIPE": "alpha", "NOISE": "2", **extra}
        proc = subprocess.run(["bash", "train.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and "--noise must be in [0, 1]" in proc.stderr, proc.stderr[-1000:]
        assert f"world seed 0, pool {pool}, run seed 1" in proc.stdout
        assert (tmp_path / "world.env").read_text() == f"WORLD_SEED=0\nPOOL={pool}\n"
