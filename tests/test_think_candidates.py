"""sim.warm_start --think-candidates: each oracle-mode hop's <think> restates the listed candidates for its domain.

The stated candidates must be exactly the prompt's lines naming the hop's domain, in listing order and with the
prices the prompt shows; the pick the cheapest of them; the routes those picks. Slips keep the short think, and
without the flag the rows are those built without it.
"""
import re
from pathlib import Path

from sim.warm_start.build import build_rows, own_template
from sim.warm_start.cli import main as oracle_main
from sim.warm_start.pool_variation import Line, Listing
from sim.warm_start.recipe import make_recipe
from router_r1.pool.registry import ModelRegistry

ROOT = Path(__file__).resolve().parents[1]
UNSEEN = ROOT / "configs" / "pool" / "sim_unseen.yaml"
LINE = re.compile(r"^(\S+) (\$[0-9.]+): (.+)$", re.M)
THINK = re.compile(r"<think>(?:Got [^<]*?\. )?A (\w+) fact\. Listed for \1: ([^<]*)\. Ask (\S+)\.</think>")
ASKED = re.compile(r"Ask (\S+)\.</think>")
STATED = re.compile(r"(?: Listed for \w+| None listed for \w+; all topics): [^<]*?\.(?= Ask )")


def rows(tmp_path, **kw):
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    recipe = make_recipe(out_dir=tmp_path, n=kw.pop("n", 80), pool=UNSEEN, tokenizer=False, **kw)
    return build_rows(recipe, own_template(Path(tmp_path), None))[0]


def naming(row, domain) -> list[tuple[str, str]]:
    """(name, shown price) of the prompt's lines naming `domain`, in listing order."""
    lines = LINE.findall(row["prompt"][-1]["content"])
    assert len(lines) >= 6, row["prompt"]
    return [(name, price) for name, price, topics in lines if domain in topics.split(", ")]


def test_oracle_thinks_state_the_listed_candidates_and_pick_the_cheapest(tmp_path):
    seen = set(ModelRegistry.from_yaml(UNSEEN).seen().names)
    got = rows(tmp_path, noise=0.3, add_rival=1.0, rename=1.0, think_candidates=True)
    oracle = [r for r in got if r["mode"] == "oracle"]
    assert len(oracle) > 40
    two_stated = rival_picked = 0
    for r in oracle:
        thinks = THINK.findall(r["response_text"])
        assert thinks, r["response_text"]
        for domain, stated, pick in thinks:
            listed = naming(r, domain)
            assert [tuple(c.rsplit(" ", 1)) for c in stated.split(", ")] == listed  # exactly those lines, in order
            prices = {name: float(price[1:]) for name, price in listed}
            assert pick == min(prices, key=prices.get)  # the cheapest stated
            two_stated += len(listed) > 1
            rival_picked += pick not in seen
        # every route is a stated pick or a retry's, in order
        assert ASKED.findall(r["response_text"]) == list(r["route_models"])
        assert len(thinks) == len(re.findall(r"A \w+ fact\. ", r["response_text"]))  # no hop without its statement
    assert two_stated > 10 and rival_picked > 5  # the rival line is stated beside the pool's and often picked
    for r in got:
        if r["mode"] != "oracle":  # slips keep the short think: a statement is always followed by its cheapest
            assert "Listed for" not in r["response_text"]


def test_without_the_flag_rows_are_the_flagged_rows_less_the_statements(tmp_path):
    for kw in ({}, {"add_rival": 1.0}, {"vary_pool": 0.5, "add_rival": 0.5}, {"confuse": 0.5}):
        off = rows(tmp_path / "off", n=60, noise=0.3, **kw)
        on = rows(tmp_path / "on", n=60, noise=0.3, think_candidates=True, **kw)
        assert any("Listed for" in r["response_text"] for r in on)
        assert not any("Listed for" in r["response_text"] for r in off)
        for a, b in zip(off, on):
            stripped = {**b, "response_text": STATED.sub("", b["response_text"]),
                        "segments": [{**s, "text": STATED.sub("", s["text"])} for s in b["segments"]]}
            assert stripped == a, (a["response_text"], b["response_text"])


def test_the_pools_own_listing_is_stated_for_plain_rows_and_confused_hops_keep_the_short_think(tmp_path):
    got = rows(tmp_path, noise=0.0, confuse=1.0, confuse_domains=("science",), think_candidates=True)
    for r in got:
        assert not r["listing"]
        if r["mode"] == "confused":
            assert "A science fact. Ask " in r["response_text"]  # the slip: no statement before it
    text = " ".join(r["response_text"] for r in got)
    assert "A people fact. Listed for people: Mistral-7B-Instruct $0.20. Ask Mistral-7B-Instruct." in text
    assert "Listed for science" not in text  # every science hop was confused


def test_no_line_naming_the_domain_states_the_generalists():
    from sim.warm_start.oracle import stated_candidates

    seen = ModelRegistry.from_yaml(UNSEEN).seen()
    qwen, big, mix = seen["Qwen2.5-7B-Instruct"], seen["LLaMA-3.1-70B-Instruct"], seen["Mixtral-8x22B-Instruct"]
    listing = Listing((Line(mix, mix.name, ()), Line(qwen, qwen.name, ("science",)), Line(big, big.name, ())))
    assert stated_candidates(listing, "science") == "Listed for science: Qwen2.5-7B-Instruct $0.30."
    assert stated_candidates(listing, "arts") == ("None listed for arts; all topics: Mixtral-8x22B-Instruct $1.20, "
                                                  "LLaMA-3.1-70B-Instruct $0.88.")
    assert listing.choice("arts") is big  # what the oracle then picks: the cheapest stated


def test_a_template_not_showing_the_pools_lines_is_an_error(tmp_path, capsys):
    template = tmp_path / "t.txt"
    template.write_text("Models:\nX $1: all\nQuestion: {question}\n")
    assert oracle_main(["--out-dir", str(tmp_path), "--n", "5", "--think-candidates", "--prompt-template",
                        str(template), "--no-tokenizer"]) == 1
    err = capsys.readouterr().err
    assert "--think-candidates" in err and "t.txt does not list Qwen2.5-7B-Instruct $0.30" in err
