"""Oracle GraMMA trajectories from the gold graph paths: the SFT warm start.

    python -m data_process.kg_oracle --data OUT/train.parquet --graph OUT/graph --out-dir OUT/oracle --n 1500

Each trajectory is played through the same Session the environment uses, so every
observation is exactly what a rollout would append. From the start's neighbourhood (the
episode's first observation) the oracle follows the gold path by candidate number (cross-checking friends' edge images for a
visual question) and stops with the answer and the path as evidence. With probability
`noise` a trajectory is suboptimal, so RL has something to improve:
  focus  an extra FOCUS on the next node (harmless, one more turn)
  guess  stop right after the first list with a random listed neighbour
  blind  visual questions: stop with the first friend without reading any image
  bare   stop without evidence

Writes OUT/oracle.parquet (prompt, segments, response_text: what verl.trainer.sft reads),
and unless --no-tokenizer a byte-level BPE (OUT/tokenizer) and the policy config (OUT/model.json).
"""
from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gramma.actions import render, render_stop
from gramma.graph import KnowledgeGraph
from gramma.ranking import Ranker, RankConfig
from gramma.session import Session
from router_r1.flags import from_args, parser_for, run_command
from verl.trainer.dataset import to_python

NOISE_MODES = ("focus", "guess", "blind", "bare")
ACTION_TAGS = ("<action>", "</action>")
# 2 layers of width 128, as the router's embedded default: SFT + a few RL steps fit two CPU cores.
GRAPH_MODEL = {"model_type": "llama", "vocab_size": None, "hidden_size": 128, "intermediate_size": 384,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "max_position_embeddings": 1024, "tie_word_embeddings": True, "rope_theta": 10000.0}


@dataclass
class OracleConfig:
    """The oracle's settings; each field is a flag of `python -m data_process.kg_oracle`."""

    data: str = field(metadata={"required": True})  # questions parquet from data_process.kg_synth (the train split)
    graph: str = field(metadata={"required": True})  # graph directory (entities + triples)
    out_dir: str = field(metadata={"required": True})  # where oracle.parquet (and the tokenizer) are written
    n: int = 1500  # trajectories to write
    noise: float = 0.3  # share of trajectories made suboptimal on purpose, so RL has something to improve
    seed: int = 0  # seed of the question order and the noise
    max_turns: int = 6  # must equal the environment's env.max_turns
    top_k: int = 8  # must equal the environment's env.rank.top_k
    point: bool = False  # answer "[k]" (a candidate number) instead of the name
    tokenizer: bool = True  # train and save a tokenizer (--no-tokenizer: do not)
    vocab_size: int = 1024  # the trained tokenizer's vocabulary size


class OracleFailed(Exception):
    """The gold path cannot be followed with the environment's observations (e.g. not in the top-K)."""


def play(session: Session, gt: dict, mode: str, rng: random.Random, point: bool = False) -> list[dict]:
    """Segments [{text, by_policy}] of one trajectory following the gold path; `point`: answer "[k]"."""
    g, segs = session.graph, []
    path, visual = list(gt["path"]), gt.get("visual") or ""

    def act(text: str) -> None:
        segs.append({"text": text, "by_policy": True})
        obs = session.step(text)
        if obs:
            segs.append({"text": obs, "by_policy": False})
        if session.done and session.answer is None:
            raise OracleFailed("out of turns")

    def number(eid: str) -> int:
        if eid not in session.memory.candidates:
            raise OracleFailed("not listed")
        return session.memory.candidates.index(eid) + 1

    names = [g.name(p) for p in path]
    segs.append({"text": session.begin(), "by_policy": False})
    if mode == "guess":
        pick = rng.choice(session.memory.candidates)
        act(render_stop(f"[{number(pick)}]" if point else g.name(pick), [names[0], g.name(pick)], think="guess"))
        return segs
    if visual:
        friends = [c for c in session.memory.candidates
                   if any(e.outgoing and e.relation == "friend_of" for e in g.edges_between(path[0], c))]
        if path[1] not in friends:
            raise OracleFailed("not listed")
        if mode == "blind":
            act(render_stop(f"[{number(friends[0])}]" if point else g.name(friends[0]), names, think="a friend"))
            return segs
        for f in friends:
            if not any(img for e in g.edges_between(path[0], f) for img in e.triple.images):
                continue
            act(render("CROSS_MODAL", str(number(f)), think=f"look for {visual}"))
            if f == path[1]:
                break
    else:
        for i, (node, rel) in enumerate(zip(path[1:-1], gt["relations"])):
            k = number(node)
            if mode == "focus" and i == 0:
                act(render("FOCUS", str(k), think=f"check {rel}"))
            act(render("EXPAND", str(k), think=f"follow {rel}"))
    answer = f"[{number(path[-1])}]" if point else names[-1]  # the answer must be in view either way
    # Thoughts name no entity: the small policy copies names badly, and a wrong name costs turn tokens.
    think = f"found by {gt['relations'][-1]}" if not visual else f"shown with {visual}"
    act(render_stop(answer, [] if mode == "bare" else names, think=think))
    return segs


def pick_mode(visual: bool, noise: float, rng: random.Random) -> str:
    if rng.random() >= noise:
        return "oracle"
    return rng.choice([m for m in NOISE_MODES if m != "blind" or visual])


def build_rows(cfg: OracleConfig, graph: KnowledgeGraph) -> tuple[list[dict], dict[str, int]]:
    """`cfg.n` trajectories over the questions of `cfg.data` (cycled, fresh noise each pass)."""
    import pandas as pd

    from router_r1.reward.qa_em import em_score

    if not 0.0 <= cfg.noise <= 1.0:
        raise ValueError(f"--noise must be in [0, 1], got {cfg.noise}")
    frame = pd.read_parquet(cfg.data)
    questions = [{k: to_python(v) for k, v in r.items()} for r in frame.to_dict("records")]
    if not questions:
        raise ValueError(f"{cfg.data}: no questions")
    ranker = Ranker(graph, RankConfig(top_k=cfg.top_k))
    rng = random.Random(cfg.seed)
    rows, skipped = [], {}
    order = list(range(len(questions)))
    while len(rows) < cfg.n:
        rng.shuffle(order)
        before = len(rows)
        for qi in order[: cfg.n - len(rows)]:
            q = questions[qi]
            gt, info = q["reward_model"]["ground_truth"], q["extra_info"]
            mode = pick_mode(bool(gt.get("visual")), cfg.noise, rng)
            s = Session(graph, ranker, info["question"], info["start"], cfg.max_turns)
            try:
                segs = play(s, gt, mode, rng, cfg.point)
            except OracleFailed as e:
                skipped[str(e)] = skipped.get(str(e), 0) + 1
                continue
            text = "".join(x["text"] for x in segs)
            rows.append({"uid": f"{info['uid']}-oracle-{len(rows)}", "prompt": q["prompt"], "segments": segs,
                         "response_text": text, "kind": q["data_source"], "mode": mode,
                         "em": em_score(s.answer, gt["target"]), "turns": s.turn})
        if len(rows) == before:
            raise ValueError(f"{cfg.data}: the oracle cannot follow any gold path (skipped: {skipped})")
    return rows, skipped


def build_tokenizer(out_dir: Path, corpus: list[str], graph: KnowledgeGraph, vocab_size: int):
    """Byte-level BPE on our texts; entity-name words and relation names become single tokens."""
    import re

    from tokenizers import AddedToken, Tokenizer
    from transformers import AutoTokenizer

    from verl.utils.tiny import TAGS, train_bpe_json, wrap_tokenizer

    tags = tuple(TAGS) + ACTION_TAGS
    raw = Tokenizer.from_str(train_bpe_json(corpus, vocab_size=vocab_size, tags=tags))
    words = sorted({w for e in graph.entities.values() for n in [e.name, *e.aliases] for w in re.findall(r"\w+", n)}
                   | {t.relation for t in graph.triples})
    raw.add_tokens([AddedToken(w, single_word=True, normalized=False) for w in words if w not in tags])
    wrap_tokenizer(raw.to_str()).save_pretrained(out_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    for text in corpus[:200]:  # the rollout decodes what it generated: text must round-trip
        if tok.decode(tok(text, add_special_tokens=False)["input_ids"]) != text:
            raise RuntimeError(f"{out_dir}: text does not round-trip: {text[:80]!r}")
    return tok


def chat_text(messages: list[dict]) -> str:
    from verl.utils.tiny import EOS, IM_START

    return "".join(f"{IM_START}{m['role']}\n{m['content']}{EOS}\n" for m in messages) + f"{IM_START}assistant\n"


def report(rows: list[dict], skipped: dict, tok=None) -> str:
    out = []
    for name, rs in [("all", rows)] + [(m, [r for r in rows if r["mode"] == m]) for m in ("oracle", *NOISE_MODES)]:
        if rs:
            out.append(f"{name:<7} n={len(rs):<5} em={sum(r['em'] for r in rs) / len(rs):.3f} "
                       f"turns={sum(r['turns'] for r in rs) / len(rs):.2f}")
    out.append(f"skipped (gold not followable): {skipped or 'none'}")
    if tok is not None:
        n = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
        plen = [n(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)) for r in rows[:300]]
        rlen = [sum(n(s["text"]) for s in r["segments"]) for r in rows[:300]]
        olen = [n(s["text"]) for r in rows[:300] for s in r["segments"] if not s["by_policy"]]
        tlen = [n(s["text"]) for r in rows[:300] for s in r["segments"] if s["by_policy"]]
        out.append(f"tokens: prompt max {max(plen)}; response max {max(rlen)}; observation max {max(olen)}; "
                   f"turn max {max(tlen)}; vocab {len(tok)}")
    return "\n".join(out)


def run(cfg: OracleConfig) -> dict:
    import pandas as pd

    from verl.workers.model_loader import spec_for_tokenizer

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    graph = KnowledgeGraph.load(cfg.graph)
    rows, skipped = build_rows(cfg, graph)
    pd.DataFrame(rows).to_parquet(out / "oracle.parquet", index=False)
    written = {"oracle": str(out / "oracle.parquet"), "rows": len(rows), "skipped": skipped}
    tok = None
    if cfg.tokenizer:
        corpus = list(dict.fromkeys(chat_text(r["prompt"]) for r in rows)) + [r["response_text"] for r in rows]
        tok = build_tokenizer(out / "tokenizer", corpus, graph, cfg.vocab_size)
        (out / "model.json").write_text(json.dumps(spec_for_tokenizer(dict(GRAPH_MODEL), tok), indent=2) + "\n")
        written.update(tokenizer=str(out / "tokenizer"), model=str(out / "model.json"))
    written["report"] = report(rows, skipped, tok)
    return written


def parse_args(argv: list[str] | None = None) -> OracleConfig:
    p = parser_for(OracleConfig, "python -m data_process.kg_oracle", __doc__.split("\n\n")[0])
    return from_args(OracleConfig, p.parse_args(argv))


def print_written(written: dict) -> None:
    print(f"wrote {written['oracle']}: {written['rows']} rows")
    if "tokenizer" in written:
        print(f"wrote {written['tokenizer']} and {written['model']}")
    print(written["report"])


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    return run_command(lambda: run(cfg), (ValueError, OSError), print_written)


if __name__ == "__main__":
    sys.exit(main())
