"""The oracle's systematic slip (--confuse): confused domains go to the cheap model weakest on them.

The supervised policy must see the wrong expert as the most common choice for a confused
domain (so its greedy route is wrong there and RL has something to undo), the other domains
must keep their specialist, and confuse=0 must leave the data exactly as before.
"""
import collections
import re
from pathlib import Path

from sim.warm_start.cli import main as oracle_main
from router_r1.pool.registry import ModelRegistry
from sim.backend import SimBackend
from verl.trainer.sft_data import load_rows

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
ASK = re.compile(r"A (\w+) fact\. Ask ([\w.\-]+)\.")


def first_choices(rows) -> dict[str, collections.Counter]:
    """domain -> Counter of the expert each hop's first ask went to (retries excluded)."""
    out = collections.defaultdict(collections.Counter)
    for r in rows:
        for domain, model in ASK.findall(r["response_text"]):
            out[domain][model] += 1
    return out


def test_confused_domains_go_to_the_weakest_cheap_model(tmp_path, capsys):
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "300", "--noise", "0.2", "--prefer-big", "0.3",
                        "--confuse", "0.8", "--confuse-domains", "people", "--no-tokenizer", "--report"]) == 0
    assert "confused     n=" in capsys.readouterr().out
    rows = load_rows(tmp_path / "oracle.parquet")
    registry = ModelRegistry.from_yaml(SIM).seen()
    acc = {s.name: SimBackend.from_pool_yaml(SIM).experts[s.api_id].profile.accuracy for s in registry.models.values()}
    choices = first_choices(rows)
    wrong, _ = choices["people"].most_common(1)[0]
    # the greedy choice for people is a cheap model that is not reliable on people, the weakest one there
    assert acc[wrong]["people"] < 0.5 and registry[wrong].price_out_per_m < 0.5
    assert acc[wrong]["people"] == min(a["people"] for n, a in acc.items() if registry[n].price_out_per_m < 0.5)
    # unconfused domains keep their cheap specialist as the most common choice
    for domain in ("arts", "science", "geography"):
        best, _ = choices[domain].most_common(1)[0]
        assert acc[best][domain] >= 0.9, (domain, choices[domain])
    confused = [r for r in rows if r["mode"] == "confused"]
    assert confused and all("people" in r["domain"] for r in confused)
    others = [r for r in rows if r["mode"] == "oracle"]
    assert sum(r["em"] for r in confused) / len(confused) < sum(r["em"] for r in others) / len(others) - 0.2


def test_confuse_zero_leaves_the_data_unchanged_and_bad_values_are_errors(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert oracle_main(["--out-dir", str(a), "--n", "80", "--prefer-big", "0.3", "--no-tokenizer"]) == 0
    assert oracle_main(["--out-dir", str(b), "--n", "80", "--prefer-big", "0.3", "--confuse", "0",
                        "--confuse-domains", "people,arts", "--no-tokenizer"]) == 0
    assert [r["response_text"] for r in load_rows(a / "oracle.parquet")] == \
        [r["response_text"] for r in load_rows(b / "oracle.parquet")]
    assert oracle_main(["--out-dir", str(a), "--n", "5", "--confuse", "1.2", "--no-tokenizer"]) == 1
    assert "--confuse must be in [0, 1], got 1.2" in capsys.readouterr().err
    assert oracle_main(["--out-dir", str(a), "--n", "5", "--confuse", "0.5", "--confuse-domains", "cooking",
                        "--no-tokenizer"]) == 1
    assert "confuse domain 'cooking'" in capsys.readouterr().err
