"""tools/analysis/route_probs: each listed name's probability where a trajectory routes, against a direct forward."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tiny import tiny_model, tiny_tokenizer
from tools.analysis import route_probs

pytestmark = pytest.mark.usefixtures("one_thread")
NAMES = ["Qwen2.5-7B-Instruct", "LLaMA-3.1-8B-Instruct", "Mistral-7B-Instruct"]


def direct_log_prob(model, tok, prefix: str, name: str, shared: int) -> float:
    """log P(name | prefix) from one unpadded forward of prefix + name, scored after `shared` tokens."""
    ids = tok(prefix + name, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)  # (len, V)
    return sum(float(logp[i - 1, ids[i]]) for i in range(shared, len(ids)))


def test_name_log_probs_match_a_direct_forward_for_multi_token_names():
    tok = tiny_tokenizer()  # the names are several BPE pieces each; the trailing space merges into them
    model = tiny_model(len(tok), seed=3).eval()
    prefix = "<think>A science fact. Ask "
    got = route_probs.name_log_probs(model, tok, prefix, NAMES)
    seqs = [tok(prefix + n, add_special_tokens=False)["input_ids"] for n in NAMES]
    shared = next(i for i in range(min(map(len, seqs))) if len({s[i] for s in seqs}) > 1)  # where they part
    assert shared < len(tok(prefix, add_special_tokens=False)["input_ids"])  # the space merged into the names
    for name, lp in zip(NAMES, got):
        assert lp == pytest.approx(direct_log_prob(model, tok, prefix, name, shared), abs=1e-4)


def test_whole_token_names_get_the_next_token_softmax_restricted_to_them():
    tok = tiny_tokenizer(extra_tokens=NAMES)
    model = tiny_model(len(tok), seed=4).eval()
    prefix = "<think>A people fact. Ask "
    lp = route_probs.name_log_probs(model, tok, prefix, NAMES)
    ids = tok(prefix, add_special_tokens=False)["input_ids"]
    name_ids = [tok.convert_tokens_to_ids(n) for n in NAMES]
    with torch.no_grad():
        nxt = model(input_ids=torch.tensor([ids])).logits[0, -1].float().softmax(-1)[name_ids]  # (3,)
    want = (nxt / nxt.sum()).tolist()
    got = torch.tensor(lp).softmax(-1).tolist()
    assert got == pytest.approx(want, abs=1e-5)


def trajectory(uid: str) -> dict:
    hop1 = "<think>A people fact. Ask Mistral-7B-Instruct.</think><search>Mistral-7B-Instruct: Who mentored Ada?</search>"
    info = "\n\n<information>Bo. Ada was mentored by Bo.</information>\n\n"
    hop2 = "<think>Got Bo. A geography fact. Ask LLaMA-3.1-8B-Instruct.</think><search>LLaMA-3.1-8B-Instruct: Where was Bo born?</search>"
    return {"run": "SFT router", "uid": uid, "text": hop1 + info + hop2 + info + "<answer>Oslo</answer>",
            "turns": [{"generated": hop1, "action": "route", "model": "Mistral-7B-Instruct", "domain": "people"},
                      {"generated": hop2, "action": "route", "model": "LLaMA-3.1-8B-Instruct", "domain": "geography"},
                      {"generated": "<answer>Oslo</answer>", "action": "answer", "model": None}]}


def test_route_points_find_each_routed_name_in_the_text():
    t = trajectory("q0")
    for at_route, before in [(True, "</think><search>"), (False, "A geography fact. Ask ")]:
        points = route_probs.route_points(t, at_route)
        assert [(m, d) for _, m, d in points] == [("Mistral-7B-Instruct", "people"),
                                                  ("LLaMA-3.1-8B-Instruct", "geography")]
        for offset, model, _ in points:
            assert t["text"][offset:offset + len(model)] == model
        assert t["text"][:points[1][0]].endswith(before)


def test_a_route_apart_from_its_think_is_read_where_the_search_names_it():
    # an RL router writes "Ask X" and routes to Y: its routing decision is the name in <search>
    hop = "<think>A science fact. Ask Mistral-7B-Instruct.</think><search>LLaMA-3.1-8B-Instruct: Who found Sorium?</search>"
    t = {"text": hop + "\n\n<information>Bo.</information>\n\n<answer>Bo</answer>",
         "turns": [{"generated": hop, "action": "route", "model": "LLaMA-3.1-8B-Instruct", "domain": "science"}]}
    (offset, model, _), = route_probs.route_points(t)
    assert t["text"][:offset].endswith("Mistral-7B-Instruct.</think><search>")
    hop_first = hop.replace("Ask Mistral-7B-Instruct", "Ask LLaMA-3.1-8B-Instruct")
    t_first = {"text": hop_first, "turns": [dict(t["turns"][0], generated=hop_first)]}
    (offset, _, _), = route_probs.route_points(t_first, at_route=False)
    assert t_first["text"][:offset].endswith("Ask ")


def test_think_names_find_the_name_each_think_writes_before_its_search():
    t = trajectory("q0")
    thinks = route_probs.think_names(t, NAMES)
    assert [n for _, n in thinks] == ["Mistral-7B-Instruct", "LLaMA-3.1-8B-Instruct"]
    assert t["text"][:thinks[1][0]].endswith("A geography fact. Ask ")
    bare = "<think>A people fact.</think><search>Mistral-7B-Instruct: Who mentored Ada?</search>"
    assert route_probs.think_names({"text": bare, "turns": [{"generated": bare, "action": "route",
                                                              "model": "Mistral-7B-Instruct"}]}, NAMES) == [None]


def test_the_decision_averages_the_route_over_the_names_the_think_could_write():
    tok = tiny_tokenizer(extra_tokens=NAMES)
    model = tiny_model(len(tok), seed=8).eval()
    t, context = trajectory("q0"), "Question: who?\n"
    (offset, _, _), _ = route_probs.route_points(t)
    (t_at, t_name), _ = route_probs.think_names(t, NAMES)
    got = route_probs.decision_probs(model, tok, context, t["text"], offset, (t_at, t_name), NAMES)

    def dist(prefix):
        return torch.tensor(route_probs.name_log_probs(model, tok, prefix, NAMES)).softmax(-1)  # (3,)
    p_think = dist(context + t["text"][:t_at])
    after = t["text"][t_at + len(t_name):offset]  # ".</think><search>"
    want = sum(p_think[i] * dist(context + t["text"][:t_at] + x + after) for i, x in enumerate(NAMES))
    assert got == pytest.approx(want.tolist(), abs=1e-5) and sum(got) == pytest.approx(1.0)
    own = dist(context + t["text"][:offset]).tolist()  # the route after the trajectory's own think differs
    assert max(abs(a - b) for a, b in zip(got, own)) > 1e-3
    assert route_probs.decision_probs(model, tok, context, t["text"], offset, None, NAMES) == pytest.approx(own)


def test_main_writes_a_table_whose_rows_sum_to_one(tmp_path):
    tok = tiny_tokenizer(extra_tokens=NAMES)
    ckpt = tmp_path / "hf"
    tiny_model(len(tok), seed=5).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    rows = [{"data_source": "sim_2hop", "prompt": [{"role": "user", "content": f"Question {i}"}],
             "extra_info": {"uid": f"q{i}"}} for i in range(2)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    (tmp_path / "traj.jsonl").write_text("".join(json.dumps(trajectory(f"q{i}")) + "\n" for i in range(2)))
    out = tmp_path / "probs.md"
    assert route_probs.main(["--checkpoint", str(ckpt), "--data", str(tmp_path / "test.parquet"), "--trajectories",
                             str(tmp_path / "traj.jsonl"), "--out", str(out), "--json", str(tmp_path / "r.json")]) == 0
    records = json.loads((tmp_path / "r.json").read_text())
    assert len(records) == 4 and {r["domain"] for r in records} == {"people", "geography"}
    for r in records:
        assert sum(r["probs"].values()) == pytest.approx(1.0)
    people = [line for line in out.read_text().splitlines() if line.startswith("| people |")]
    assert len(people) == 1 and people[0].split("|")[2].strip() == "2"


def test_names_with_no_prefix_before_them_are_refused():
    tok = tiny_tokenizer(extra_tokens=NAMES)
    with pytest.raises(ValueError, match="non-empty prefix"):
        route_probs.name_log_probs(tiny_model(len(tok), seed=7).eval(), tok, "", NAMES)


def test_a_uid_missing_from_the_data_is_an_error_naming_it(tmp_path):
    tok = tiny_tokenizer(extra_tokens=NAMES)
    model = tiny_model(len(tok), seed=6).eval()
    with pytest.raises(SystemExit, match="uid q9"):
        route_probs.probe(model, tok, {"q0": "p"}, [trajectory("q9")], NAMES)


def test_a_sim_pool_adds_each_domains_best_model_and_its_probability(tmp_path):
    pool = tmp_path / "pool.yaml"
    pool.write_text("world: sim\ndefaults: {base_url: 'http://127.0.0.1:1/v1'}\nmodels:\n" + "".join(
        f"  - {{name: {n}, api_id: sim/{n.lower()}, price_out_per_m: {p}, sim: {{accuracy: {acc}}}}}\n"
        for n, p, acc in [(NAMES[0], 0.30, "{default: 0.3, people: 0.95}"),
                          (NAMES[1], 0.18, "{default: 0.3, geography: 0.95}"),
                          (NAMES[2], 0.20, "{default: 0.3, people: 0.95}")]))
    best = route_probs.best_per_domain(pool, NAMES)
    assert best["people"] == NAMES[2] and best["geography"] == NAMES[1]  # a tie goes to the cheaper
    records = [{"domain": "people", "chosen": NAMES[0], "mass": 1.0, "probs": dict(zip(NAMES, [0.5, 0.1, 0.4]))},
               {"domain": "people", "chosen": NAMES[2], "mass": 1.0, "probs": dict(zip(NAMES, [0.2, 0.0, 0.8]))},
               {"domain": "geography", "chosen": NAMES[1], "mass": 1.0, "probs": dict(zip(NAMES, [0.7, 0.3, 0.0]))}]
    text = route_probs.table(records, NAMES, best)
    people = next(line for line in text.splitlines() if line.startswith("| people |"))
    assert people.rstrip(" |").split("|")[-1].strip() == "0.60"  # (0.4 + 0.8) / 2
    assert "P(best) over 3 hops of a known domain: 0.50" in text  # (0.4 + 0.8 + 0.3) / 3
    assert "P(best)" not in route_probs.table(records, NAMES)
