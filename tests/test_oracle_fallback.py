"""sim.warm_start --fallback listed / --fallback-drill: after a reply without an answer, the next cheapest listed line.

The stated lines must be the prompt's lines naming the hop's domain less the one that failed, in listing order; the
pick the cheapest of them; the reply before it one without an answer. Drill rows add a cheaper rival line that has
no answer for the first hop, and made-up lines answer on their own coins (twins), so the next line can answer.
"""
import re
from dataclasses import replace
from pathlib import Path

import pytest

from sim.warm_start.build import build_rows, own_template
from sim.warm_start.cli import main as oracle_main
from sim.warm_start.listings import twin, twinned
from sim.warm_start.oracle import Oracle, reply_answer
from sim.warm_start.pool_variation import Line, Listing, canonical_listing
from sim.warm_start.recipe import make_recipe
from router_r1.pool.registry import ModelRegistry
from sim.backend import SimBackend
from sim.world import SimWorld

ROOT = Path(__file__).resolve().parents[1]
UNSEEN = ROOT / "configs" / "pool" / "sim_unseen.yaml"
LINE = re.compile(r"^(\S+) \$([0-9.]+): (.+)$", re.M)
# the failed ask's name, its reply, the fallback's domain, stated lines and pick
FALLBACK = re.compile(r"<search>(\S+): [^<]*</search>\s*<information>([^<]*)</information>\s*"
                      r"<think>No answer\. Next listed for (\w+): ([^<]*)\. Ask (\S+)\.</think>")


def rows(tmp_path, **kw):
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    kw = {"n": 120, "noise": 0.0, **kw}
    recipe = make_recipe(out_dir=tmp_path, pool=UNSEEN, tokenizer=False, think_candidates=True, **kw)
    return build_rows(recipe, own_template(Path(tmp_path), None))[0]


def naming(row, domain) -> list[tuple[str, float]]:
    """(name, price) of the prompt's lines naming `domain`, in listing order."""
    lines = LINE.findall(row["prompt"][-1]["content"])
    assert len(lines) >= 6, row["prompt"]
    return [(name, float(price)) for name, price, topics in lines if domain in topics.split(", ")]


def test_the_listed_fallback_states_the_lines_left_and_asks_the_cheapest(tmp_path):
    got = rows(tmp_path, add_rival=0.5, fallback="listed", fallback_drill=0.5)
    seen = set(ModelRegistry.from_yaml(UNSEEN).seen().names)
    drills = [r for r in got if r["mode"] == "drill"]
    assert 20 < len(drills) < 80  # about half the oracle rows, less those whose bank has no failing name
    fallbacks = 0
    for r in got:
        for failed, reply, domain, stated, pick in FALLBACK.findall(r["response_text"]):
            fallbacks += 1
            assert reply_answer(reply) is None, reply  # only a reply without an answer is followed by a fallback
            left = [(n, p) for n, p in naming(r, domain) if n != failed]
            assert [tuple(c.rsplit(" $", 1)) for c in stated.split(", ")] == [(n, f"{p:.2f}") for n, p in left]
            assert pick == min(left, key=lambda np: np[1])[0]
    assert fallbacks >= len(drills)
    for r in drills:
        first, second = r["route_models"][:2]
        listed = dict(naming(r, r["domain"].split(">")[0]))
        assert first not in seen and listed[first] < min(p for n, p in listed.items() if n in seen)  # the rival
        assert second == min((n for n in listed if n != first), key=listed.get)  # then the next cheapest line
    # the next line answers on its own coins: most drill rows end right, as plain rows do
    assert sum(r["em"] for r in drills) / len(drills) > 0.8


def test_of_several_lines_left_the_cheapest_is_asked_and_a_whole_question_goes_to_the_most_reliable():
    backend = SimBackend.from_pool_yaml(UNSEEN)
    seen = ModelRegistry.from_yaml(UNSEEN).seen()
    qwen = seen["Qwen2.5-7B-Instruct"]
    own = canonical_listing(seen)
    dear, cheap = Line(replace(qwen, name="Kavo-7B", aliases=(), price_out_per_m=0.40), qwen.name, ("science",)), \
        Line(replace(qwen, name="Pone-2B", aliases=(), price_out_per_m=0.10), qwen.name, ("science",))
    listing = twinned(Listing((dear,) + own.lines + (cheap,)), backend)
    oracle = Oracle(backend, listing.registry, specialist=listing.choices(), listing=listing, fallback="listed")
    by_name = listing.registry
    pick, think = oracle.retry("science", by_name["Pone-2B"])
    assert pick.name == "Qwen2.5-7B-Instruct"
    assert think == "No answer. Next listed for science: Kavo-7B $0.40, Qwen2.5-7B-Instruct $0.30. Ask Qwen2.5-7B-Instruct."
    assert oracle.retry("science", by_name["Qwen2.5-7B-Instruct"])[0].name == "Pone-2B"
    assert oracle.retry("science", by_name["Mixtral-8x22B-Instruct"])[0].name == "Pone-2B"  # a generalist's miss too
    # the old rule, unstated: the most reliable other model, the cheaper of equals
    assert oracle.retry("science", by_name["Pone-2B"], whole=True) == (qwen, "No answer. Ask Qwen2.5-7B-Instruct.")
    with pytest.raises(ValueError, match="listed with a listing"):
        Oracle(backend, seen, fallback="listed")


def test_on_the_pools_own_listing_the_listed_fallback_routes_as_the_old_rule(tmp_path):
    """One line names each domain there: after a specialist's miss both ask Mixtral-8x22B, after a slip's miss
    both ask the domain's specialist; only the think differs, stating the line."""
    best = rows(tmp_path / "b", noise=0.3, confuse=0.3)
    listed = rows(tmp_path / "l", noise=0.3, confuse=0.3, fallback="listed")
    assert any("No answer. Ask Mixtral" in r["response_text"] for r in listed)
    stated = re.compile(r"(?<=No answer\. )Next listed for \w+: [^<]*?\. (?=Ask )")
    assert sum(bool(stated.search(r["response_text"])) for r in listed) > 3  # the slips' misses
    for a, b in zip(best, listed):
        unstated = {**b, "response_text": stated.sub("", b["response_text"]),
                    "segments": [{**s, "text": stated.sub("", s["text"])} for s in b["segments"]]}
        assert unstated == a


def test_a_made_up_line_is_a_twin_that_misses_on_its_own_coins():
    backend = SimBackend.from_pool_yaml(UNSEEN)
    seen = ModelRegistry.from_yaml(UNSEEN).seen()
    qwen = seen["Qwen2.5-7B-Instruct"]
    listing = canonical_listing(seen)
    assert twinned(listing, backend) == listing  # the pool's own lines keep their backends
    kavo = twin(backend, replace(qwen, name="Kavo-7B"))
    assert kavo.api_id == "sim/qwen2.5-7b-instruct~Kavo-7B" and twin(backend, kavo) == kavo
    a, b = backend.experts[qwen.api_id], backend.experts[kavo.api_id]
    assert a.profile is b.profile
    world = SimWorld(seed=0)
    facts = [world.fact(rel, subj) for rel, subj in world.facts if rel in ("discovered_by", "symbol")][:400]
    assert facts
    knows_a, knows_b = [a.knows(f) for f in facts], [b.knows(f) for f in facts]
    assert sum(knows_a) > 0.9 * len(facts) and sum(knows_b) > 0.9 * len(facts)  # the same skill
    assert knows_a != knows_b  # but their own misses


@pytest.mark.parametrize("args, words", [
    (["--fallback", "listed"], "add --think-candidates"),
    (["--think-candidates", "--fallback-drill", "0.2"], "only with --fallback listed"),
    (["--think-candidates", "--fallback", "listed", "--fallback-drill", "1.5"], "must be in [0, 1]"),
])
def test_bad_fallback_flags_are_errors(tmp_path, capsys, args, words):
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "5", "--no-tokenizer", "--pool", str(UNSEEN), *args]) == 1
    assert words in capsys.readouterr().err
