"""The cost knob and calibration on what a run says it was trained for (issue 45, items 6 and 7): a run saved with
one alpha answers `router-r1@A` and `"alpha": A` with a 400 that says how to train one that takes the knob, and
refuses `serve --alphas` and calibration; without pool flags both take the run's pool, simulated in-process."""
import json
import shutil
from pathlib import Path

import openai
import pytest
import yaml

from router_r1 import serve
from router_r1.calibrate import main as calibrate_main
from router_r1.runtime import EvalError
from router_r1.serve import RouterServerThread, parse_args, serving
from router_r1.serve_engine import KNOB_ALPHAS, KNOB_POOL, TRAIN_KNOB, load_run_settings
from serve_fixture import ALPHAS, ANSWER, SIM, TURNS, write_val_parquet

QUESTION = "What is the capital of Veloria?"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fixed_run(trained_router, tmp_path_factory):
    """The tiny router with a run config that says it was trained at the one alpha 0 (no env.alphas)."""
    out = tmp_path_factory.mktemp("fixed") / "hf"
    shutil.copytree(trained_router, out)
    env = {"factory": "router_r1.router_env:make_env", "alpha": 0.0, "pool": str(SIM), **TURNS}
    (out / "run_config.yaml").write_text(yaml.safe_dump({"env": env}))
    return out


@pytest.fixture(scope="module")
def fixed_served(fixed_run):
    with serving(parse_args(["--checkpoint", str(fixed_run)])) as service, RouterServerThread(service) as srv:
        yield service, openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def val_file(tmp_path_factory):
    return write_val_parquet(tmp_path_factory.mktemp("val") / "val.parquet")


def ask(client, model="router-r1", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}], **kw)


def test_a_run_trained_at_one_alpha_answers_the_knob_with_a_400_saying_how_to_train_one(fixed_served, fixed_run):
    service, client = fixed_served
    assert service.pool.where.startswith("simulated")  # no pool flag: the run's pool, in-process
    assert [m.id for m in client.models.list()] == ["router-r1"]
    for model, body, param in (("router-r1@0.6", None, "model"), ("router-r1", {"alpha": 0.6}, "alpha")):
        with pytest.raises(openai.BadRequestError) as err:
            ask(client, model, extra_body=body)
        e = err.value
        assert e.status_code == 400 and e.code == "alpha_not_trained" and e.param == param
        message = e.body["message"]
        assert "asks for alpha 0.6" in message and "trained at the one alpha 0 " in message
        assert f"{fixed_run / 'run_config.yaml'} has no env.alphas" in message and TRAIN_KNOB in message
    # its own alpha asks for what it does anyway; plain router-r1 answers, its prompt stating no alpha
    for model in ("router-r1", "router-r1@0"):
        r = ask(client, model, extra_body={"trace": True})
        assert r.choices[0].message.content == ANSWER and r.model_extra["router_r1"]["alpha"] is None
        assert "Cost weight" not in r.model_extra["router_r1"]["trace"]["prompt"]


def test_serve_alphas_refuses_a_run_saved_with_one_alpha(fixed_run, trained_router, tmp_path, monkeypatch, capsys):
    async def listening(*args):  # reached only when start-up accepted the checkpoint
        raise AssertionError("the server started")

    monkeypatch.setattr(serve, "_serve_forever", listening)
    assert serve.main(["--checkpoint", str(fixed_run), "--alphas", "0", "0.6"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --alphas 0 0.6: ") and len(err.splitlines()) == 1
    assert f"{fixed_run / 'run_config.yaml'} says this run was trained at the one alpha 0" in err and TRAIN_KNOB in err
    # a conditioned run takes a subset of its trained alphas, not another
    assert load_run_settings(trained_router, alphas=[0.6]).alphas == (0.6,)
    with pytest.raises(EvalError, match=r"--alphas 0.45: not among the alphas this run was trained on"):
        load_run_settings(trained_router, alphas=[0, 0.45])
    # where no run config says (an SFT run's env: null), --alphas declares it conditioned, as before
    assert load_run_settings(tmp_path, alphas=[0, 0.6]).alphas == (0.0, 0.6)


def test_calibrate_defaults_to_the_run_s_pool_and_alphas_and_names_an_id_the_server_takes(
        trained_router, val_file, tmp_path, capsys):
    base = ["--checkpoint", str(trained_router), "--data", str(val_file)]
    # the documented command, no pool flag: the run's simulated pool in-process, not its yaml's dead endpoint
    assert calibrate_main([*base, "--target-cost-per-1k", "0.03", "--out", str(tmp_path / "a")]) in (0, 1)
    out = json.loads((tmp_path / "a" / "calibration.json").read_text())
    assert out["pool"].startswith(f"simulated {SIM}") and "unreachable" not in capsys.readouterr().err
    assert [p["alpha"] for p in out["points"]] == list(ALPHAS)  # the alphas it was trained on
    assert calibrate_main([*base, "--target-cost-per-1k", "1000", "--out", str(tmp_path / "b")]) == 0
    out = json.loads((tmp_path / "b" / "calibration.json").read_text())
    assert out["chosen_alpha"] == 0.0 and out["model"] == "router-r1@0"  # equal EM: the smaller alpha
    assert "(serve it as router-r1@0)" in capsys.readouterr().out
    with serving(parse_args(["--checkpoint", str(trained_router)])) as service:
        assert out["model"] in service.model_ids()
        call = service.parse({"model": out["model"], "messages": [{"role": "user", "content": QUESTION}]})
        assert call.alpha == out["chosen_alpha"]
    # an alpha it was not trained on is calibrated, with a warning
    assert calibrate_main([*base, "--alphas", "0.45", "--target-cost-per-1k", "1000", "--out", str(tmp_path / "c")]) == 0
    assert "alphas 0.45 are not among the trained [0.0, 0.6]" in capsys.readouterr().out


def test_calibrate_refuses_a_run_trained_at_one_alpha(fixed_run, val_file, tmp_path, capsys):
    argv = ["--checkpoint", str(fixed_run), "--data", str(val_file), "--target-cost-per-1k", "0.03",
            "--out", str(tmp_path)]
    assert calibrate_main(argv) == 2
    err = capsys.readouterr().err
    assert f"{fixed_run / 'run_config.yaml'} has no env.alphas" in err and "trained at the one alpha 0 " in err
    assert TRAIN_KNOB in err and not (tmp_path / "calibration.json").exists()


def test_the_knob_command_trains_on_the_alpha_recipe_s_pool_and_alphas(tmp_path):
    """TRAIN_KNOB's pieces agree: the recipe's alphas and pool are the ones its run config is given, and that
    config makes the SFT run a conditioned one the server lists `router-r1@0.6` for (the command itself, 13 min
    on 2 cores, runs at full size only by hand)."""
    from experiments.alpha_tradeoff.conditioned_env import main as conditioned_env

    recipe = yaml.safe_load((ROOT / "configs" / "recipes" / "alpha.yaml").read_text())
    assert recipe["per_alpha"]["alphas"] == list(KNOB_ALPHAS) and recipe["pool"] == KNOB_POOL
    assert f"{KNOB_POOL} {' '.join(f'{a:g}' for a in KNOB_ALPHAS)}" in TRAIN_KNOB
    run_config = tmp_path / "run_config.yaml"
    run_config.write_text(yaml.safe_dump({"env": None, "trainer": {"mode": "sft"}}))  # what an SFT run saves
    assert load_run_settings(tmp_path).alphas == ()
    conditioned_env([str(run_config), KNOB_POOL, *(f"{a:g}" for a in KNOB_ALPHAS)])
    settings = load_run_settings(tmp_path)
    assert settings.alphas == KNOB_ALPHAS and settings.pool == KNOB_POOL and settings.saved


def test_readme_and_usage_give_the_knob_command_and_serve_its_output():
    """The command the 400 names is the one README and docs/usage.md give, and the server and calibration there
    load what it writes (train.sh's OUT/sft, OUT/data/val.parquet)."""
    one_line = " ".join(TRAIN_KNOB.split())
    for doc in ("README.md", "docs/usage.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert one_line in text, doc
    usage = " ".join((ROOT / "docs" / "usage.md").read_text().split())
    assert "OUT=outputs/alpha bash train.sh" in one_line and "outputs/alpha/sft/run_config.yaml" in one_line
    assert "python -m router_r1.serve --checkpoint outputs/alpha/sft " in usage
    assert "python -m router_r1.calibrate --checkpoint outputs/alpha/sft --data outputs/alpha/data/val.parquet" in usage
