"""sim.warm_start --misname-drill: a misspelt first route, the environment's invalid-action hint, the route again.

The slip must name no model, its hint must be the very text the environment appends with env.invalid_hint, the
recovery must route where the think said, and the SFT loss must skip the slip (segment loss false) but learn the
recovery. Rows without the drill are the rows of the same seed without it.
"""
from pathlib import Path

import pytest

from sim.warm_start.build import build_rows, own_template
from sim.warm_start.misname import misspell
from sim.warm_start.recipe import make_recipe
from router_r1.episodes.episode import Episode, TurnRules
from router_r1.eval.evaluate import EvalConfig
from router_r1.flags import parser_for
from router_r1.pool.registry import ModelRegistry
from router_r1.runtime import EnvOverrides, resolve_env
from test_oracle_fallback import UNSEEN, rows  # the oracle's rows over sim_unseen.yaml, thinks stating the lines
from verl.trainer.sft_data import SFTDataError, check_row, tokenize_example
from verl.utils.tiny import tiny_tokenizer

SEEN = ModelRegistry.from_yaml(UNSEEN).seen()


def edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def test_a_misspelling_is_one_or_two_letters_off_and_names_no_model():
    import random
    rng = random.Random(0)
    for name in [*SEEN.names, "SciGLM-6B", "GeoMind-3B", "Vizu2-3B-Instruct"]:
        for _ in range(30):
            wrong = misspell(name, SEEN, rng)
            assert wrong != name and SEEN.resolve(wrong) is None
            assert 1 <= edit_distance(wrong, name) <= 2  # a swap is two substitutions
            assert wrong.split("-", 1)[1:] == name.split("-", 1)[1:]  # only the first word is touched
    with pytest.raises(ValueError, match="two letters"):
        misspell("7B", SEEN, rng)


def test_drill_rows_slip_read_the_environments_hint_and_route_again(tmp_path):
    got = rows(tmp_path, n=80, misname_drill=1.0)
    plain = rows(tmp_path / "plain", n=80)
    tok = tiny_tokenizer()
    drilled = [r for r in got if r["misnamed"]]
    assert len(drilled) > 40  # every oracle-mode row that opens with a route and has a turn to spare
    for r, p in zip(got, plain):
        if not r["misnamed"]:  # the drill's draws do not move the other rows
            assert {**r, "misnamed": ""} == {**p, "misnamed": ""}
            continue
        slip, hint, retry, *rest = r["segments"]
        assert rest == p["segments"][1:] and r["route_models"] == p["route_models"]
        assert slip["by_policy"] and slip["loss"] is False and not hint["by_policy"] and retry["by_policy"]
        assert f"<search>{r['misnamed']}: " in slip["text"] and SEEN.resolve(r["misnamed"]) is None
        picked = slip["text"].split("Ask ")[-1].split(".</think>")[0]
        assert picked == r["route_models"][0] and f"<search>{picked}: " in retry["text"]
        # what the environment appends after that slip, with the hint on
        rules = TurnRules(tok, SEEN, max_turns=3, max_obs_length=128, max_response_length=4096, invalid_hint=True)
        ep = Episode(prompt_ids=[1, 2, 3])
        assert rules.after_generation(ep, tok(slip["text"], add_special_tokens=False)["input_ids"]) is None
        assert ep.turns[-1]["reason"] == "unknown_model"
        assert ep.text == slip["text"] + hint["text"]


def test_the_sft_loss_skips_the_slip_and_learns_the_recovery(tmp_path):
    row = next(r for r in rows(tmp_path, n=80, misname_drill=1.0) if r["misnamed"])
    tok = tiny_tokenizer()
    ex = tokenize_example(tok, row["prompt"], row["segments"])
    n = [len(tok(s["text"], add_special_tokens=False)["input_ids"]) for s in row["segments"]]
    start = len(ex.ids) - sum(n)
    assert ex.mask[start:start + n[0]] == [0] * n[0]  # the slip
    assert ex.mask[start + n[0]:start + n[0] + n[1]] == [0] * n[1]  # the hint
    assert ex.mask[start + n[0] + n[1]:start + sum(n[:3])] == [1] * n[2]  # the recovery
    assert sum(ex.mask) == sum(k for k, s in zip(n, row["segments"]) if s["by_policy"]) - n[0]
    check_row(row, "drill row")
    for bad in ({**row["segments"][1], "loss": True}, {**row["segments"][0], "loss": "no"}):
        with pytest.raises(SFTDataError, match=r"segments\[\d\]\.loss"):
            check_row({**row, "segments": [bad, *row["segments"][1:]], "response_text": None}, "bad row")


def test_the_drill_needs_the_stated_pick_and_a_share(tmp_path):
    with pytest.raises(ValueError, match="--misname-drill"):
        build_rows(make_recipe(out_dir=tmp_path, pool=UNSEEN, tokenizer=False, misname_drill=0.2, n=4),
                   own_template(Path(tmp_path), None))
    with pytest.raises(ValueError, match="--misname-drill"):
        rows(tmp_path, n=80, misname_drill=1.5)


def test_evaluation_takes_the_hint_flag_over_the_run():
    parser = parser_for(EvalConfig, "evaluate", "")
    assert parser.parse_args(["--data", "x.parquet", "--invalid-hint"]).invalid_hint is True
    assert parser.parse_args(["--data", "x.parquet"]).invalid_hint is None  # the run's own
    quiet = dict(log=lambda m: None)
    assert resolve_env([], EnvOverrides(), **quiet).invalid_hint is False  # the paper run's: no hint
    assert resolve_env([], EnvOverrides(invalid_hint=True), **quiet).invalid_hint is True
