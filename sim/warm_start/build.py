"""The warm-start builder: simulated train questions -> oracle rows -> OUT/oracle.parquet, OUT/prompt_template.txt
(give it to sim.qa so RL sees the same prompts), the embedded default's BPE tokenizer and model config
(OUT/tokenizer, OUT/model.json; tokenizer false skips them) and a report.

A row's routes come from one route source: the hop-by-hop oracle here (`HopRoutes`, oracle.py's annotator with the
listing and drill augmentations of its recipe), or one that plans its own (alpha.py's per-alpha routes, budget.py's
turn budgets). The source also fixes the row's columns, so each recipe writes the columns its data always had.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional

from data_process.schema import DataBuildError
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.messages import submodel_messages
from router_r1.pool.world import SIM_POOL
from router_r1.pool.listing import LISTINGS
from router_r1.prompts import build_router_prompt, fill_template, load_template, with_pool
from router_r1.reward.format import check_format
from router_r1.reward.qa_em import em_score
from sim.backend import SimBackend
from sim.embedded import COMPACT_TEMPLATE
from sim.warm_start.listings import RowListings, bank_names, twinned
from sim.warm_start.oracle import BIG, NOISE_MODES, Oracle, Trajectory, pick_mode
from sim.world import DEFAULT_ENTITIES, SimQuestion, SimWorld

DRILL = "drill"  # the mode of a fallback-drill row
MODES = ("oracle", "confused", DRILL, "forced", BIG, *NOISE_MODES, "uniform")  # the report's order
HOP_COLUMNS = ("data_source", "uid", "prompt", "response_text", "segments", "answers", "question", "domain", "mode",
               "routes", "renamed", "route_models", "cost_usd", "misnamed", "em",
               # a listed row's pool lines, and the pool model answering each route ("" / [] for the pool's own)
               "listing", "route_profiles")


@dataclass
class BuildConfig:
    """The builder's own settings: the world, the questions, the random slips, the outputs."""

    out_dir: Optional[str] = field(default=None, metadata={"required": True})  # where oracle.parquet, prompt_template.txt, the tokenizer and model.json are written
    n: int = 2000  # trajectories (simulated train questions)
    seed: int = 0  # the question draw and the noise
    noise: float = 0.3  # P(a random slip instead of the oracle's route: an expensive generalist, a cheap non-specialist, a guess, or the whole question at once)
    world_seed: int = 0  # the simulated world's seed: must match the simulated pool's
    world_entities: int = DEFAULT_ENTITIES  # entities per type of the world (must match the pool server's --world-entities)
    pool: str = str(SIM_POOL)  # pool yaml with sim: profiles (its seen models are routed to)
    prompt_template: Optional[str] = None  # template file, copied to OUT/prompt_template.txt (default: the compact template listing the pool's seen models)
    two_hop_frac: float = 0.4  # share of two-hop questions
    max_routes: int = 3  # routes per trajectory at most (two hops and one retry)
    report: bool = False  # print EM, routes, cost and token lengths
    tokenizer: bool = True  # train OUT/tokenizer (the embedded default's BPE, on these rows) and write OUT/model.json (--no-tokenizer: neither, e.g. for a pretrained model's rows)
    vocab_size: int = 1024  # the BPE's vocabulary (names and tags come on top)
    model: Optional[str] = None  # JSON of model config keys over the embedded default's in OUT/model.json (e.g. '{"num_hidden_layers": 4}')

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"--n must be >= 1, got {self.n}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"--noise must be in [0, 1], got {self.noise}")
        if self.max_routes < 2:
            raise ValueError(f"--max-routes must be >= 2 (two hops), got {self.max_routes}")
        if self.model is not None:
            try:
                ok = isinstance(json.loads(self.model), dict)
            except json.JSONDecodeError:
                ok = False
            if not ok:
                raise ValueError(f"--model must be a JSON object of model config keys, got {self.model!r}")


@dataclass
class Context:
    """What every route source reads: the settings, the pool's seen models, the world and its experts."""

    cfg: BuildConfig
    registry: ModelRegistry
    world: SimWorld
    backend: SimBackend
    template_path: Path


class Routed(NamedTuple):
    traj: Trajectory
    registry: ModelRegistry  # the models the row's prompt lists (a listing's own)
    columns: dict[str, Any]  # the route source's columns of the row
    template: str | None = None  # the row's own template (a listing's), else the build's


class Routes:
    """Where a row's routes come from; the base is the one-question-one-row plan without state."""

    columns: tuple[str, ...] = HOP_COLUMNS
    words: tuple[str, ...] = ()  # the tokenizer keeps these whole too
    metrics: dict[str, Any] = {}  # report name -> share of rows (rows -> float)

    def n_questions(self, n: int) -> int:
        return n

    def prepare(self, questions: list[SimQuestion]) -> None:
        """Called once with the build's questions, before the rows."""

    def items(self, questions: list[SimQuestion]):
        """(question, what the row is given) pairs, one a row."""
        return ((q, None) for q in questions)

    def draw(self, given, rng: random.Random):
        """The row's state (an alpha, a budget), drawn before its mode."""
        return None

    def prompt_args(self, state) -> dict:
        return {}

    def route(self, q: SimQuestion, mode: str, rng: random.Random, state) -> Routed:
        raise NotImplementedError

    def report(self, rows: list[dict], line) -> tuple[list[str], list[str]]:
        """(lines after the total, lines at the end) of the report."""
        return [], []


class HopRoutes(Routes):
    """The core: each hop to its domain's cheapest reliable model (oracle.py), over the row's listing."""

    def __init__(self, recipe, ctx: Context):
        cfg = ctx.cfg
        self.ctx, self.think, self.fallback = ctx, recipe.thinking.think_candidates, recipe.fallback.fallback
        self.listings = RowListings(recipe, ctx.registry, ctx.world, ctx.backend)
        # the user's file, if any, is the one to name (OUT's is its copy)
        recipe.thinking.check_template(cfg.prompt_template or ctx.template_path, self.listings.canonical, ctx.registry)
        self.oracle = Oracle(ctx.backend, ctx.registry, cfg.max_routes, recipe.habits.confuse, recipe.habits.mixed_up,
                             listing=self.listings.canonical if self.think else None, fallback=self.fallback)
        self.misname = recipe.misname_drill.start(cfg.seed, cfg.max_routes)
        self.compact = load_template(COMPACT_TEMPLATE)

    def route(self, q: SimQuestion, mode: str, rng: random.Random, state) -> Routed:
        ctx = self.ctx
        listing, drilled = self.listings.draw(q, mode)
        oracle, registry = self.oracle, ctx.registry
        if listing is not None:
            if self.fallback == "listed":
                listing = twinned(listing, ctx.backend)
            registry = listing.registry
            oracle = Oracle(ctx.backend, registry, ctx.cfg.max_routes, specialist=listing.choices(),
                            listing=listing if self.think else None, fallback=self.fallback)
        traj = oracle.run(q, mode, rng)
        ok, why = check_format(traj.text, registry)
        if not ok:  # a bug in the oracle, never in the data
            raise DataBuildError(f"oracle trajectory for {q.uid} breaks the format ({why}): {traj.text!r}")
        misnamed = self.misname(traj, mode, registry)
        profile = {ln.spec.name: ln.profile for ln in listing.lines} if listing else {}
        return Routed(traj, registry, {
            "mode": "confused" if traj.confused else DRILL if drilled else mode, "misnamed": misnamed or "",
            "listing": listing.text if listing else "",
            "route_profiles": [profile[m] for m, _ in traj.routes] if listing else [],
        }, fill_template(self.compact, **{LISTINGS["domains"]: listing.text}) if listing else None)


class Built(NamedTuple):
    rows: list[dict]
    questions: list[SimQuestion]
    routes: Routes
    ctx: Context


def build_rows(recipe, template_path: str | Path) -> Built:
    """The recipe's rows over the template at `template_path`, with what made them."""
    cfg = recipe.build
    registry = ModelRegistry.from_yaml(cfg.pool).seen()
    world = SimWorld(seed=cfg.world_seed, n_entities_per_type=cfg.world_entities)
    backend = SimBackend.from_pool_yaml(cfg.pool, seed=cfg.world_seed, latency_scale=0.0, world=world)
    ctx = Context(cfg, registry, world, backend, Path(template_path))
    routes = recipe.routes(ctx)
    template = load_template(template_path)
    renamer = recipe.names.renamer(world, with_pool(template, registry), cfg.seed)
    questions = world.questions(routes.n_questions(cfg.n), cfg.seed, "train", cfg.two_hop_frac)
    routes.prepare(questions)
    rng = random.Random(cfg.seed)
    rows, counts = [], {}
    for q, given in routes.items(questions):
        source = "sim_1hop" if len(q.hops) == 1 else "sim_2hop"
        index = counts[source] = counts.get(source, -1) + 1
        state = routes.draw(given, rng)
        mode = pick_mode(q, cfg.noise, rng, recipe.habits.prefer_big)
        routed = routes.route(q, mode, rng, state)
        traj = routed.traj
        renamed, question, segments, answers, answer = renamer(q.question, traj.segments, list(q.answers), traj.answer)
        prompt = build_router_prompt(question, routed.registry, routed.template or template,
                                     **routes.prompt_args(state))
        row = {
            "data_source": source, "uid": f"{source}-oracle-{index}", "prompt": prompt,
            "response_text": "".join(seg["text"] for seg in segments), "segments": segments, "answers": answers,
            "question": question, "domain": q.domain, "routes": len(traj.routes), "renamed": renamed,
            "route_models": [m for m, _ in traj.routes], "cost_usd": traj.cost_usd, "em": em_score(answer, answers),
            **routed.columns,
        }
        rows.append({k: row[k] for k in routes.columns})
    return Built(rows, questions, routes, ctx)


def replies(built: Built) -> list[str]:
    """Every pool model's reply (the unseen ones' too) to a sample of sub-questions, so the BPE knows their wording."""
    backend, texts = built.ctx.backend, []
    everyone = ModelRegistry.from_yaml(built.ctx.cfg.pool)
    for q in built.questions[:200]:
        for spec in everyone.models.values():
            texts.append(backend.respond(spec.api_id, submodel_messages(q.hops[0].sub_question), spec.max_tokens)[0])
    return texts


def chat_text(messages: list[dict]) -> str:
    """The messages as the ChatML template renders them (so role words get merges too)."""
    from verl.utils.tiny import EOS, IM_START

    turns = "".join(f"{IM_START}{m['role']}\n{m['content']}{EOS}\n" for m in messages)
    return f"{turns}{IM_START}assistant\n"


def report(rows: list[dict], tokenizer=None, routes: Routes | None = None) -> str:
    """EM, routes and cost overall, per group of the route source and per mode; token lengths with a tokenizer."""
    metrics = routes.metrics if routes else {}

    def line(name, rs):
        n = len(rs)
        extra = "".join(f"{k}={sum(map(f, rs)) / n:.2f} " for k, f in metrics.items())
        return (f"{name:<12} n={n:<5} em={sum(r['em'] for r in rs) / n:.3f} "
                f"routes={sum(r['routes'] for r in rs) / n:.2f} {extra}"
                f"cost={1e6 * sum(r['cost_usd'] for r in rs) / n:.2f}e-6 USD")
    groups, tail = routes.report(rows, line) if routes else ([], [])
    out = [line("all", rows), *groups]
    for mode in MODES:
        rs = [r for r in rows if r["mode"] == mode]
        if rs:
            out.append(line(mode, rs))
    if tokenizer is not None:
        plen, rlen, olen = [], [], []
        for r in rows:
            text = tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
            plen.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
            seg = [len(tokenizer(s["text"], add_special_tokens=False)["input_ids"]) for s in r["segments"]]
            rlen.append(sum(seg))
            olen += [k for k, s in zip(seg, r["segments"]) if not s["by_policy"]]
        out.append(f"tokens: prompt mean {sum(plen) / len(plen):.0f} max {max(plen)}; response mean "
                   f"{sum(rlen) / len(rlen):.0f} max {max(rlen)}; observation max {max(olen, default=0)} "
                   f"(set the rollout's max_obs_length above it); vocab {len(tokenizer)}")
    return "\n".join(out + tail)


def own_template(out: Path, prompt_template: str | Path | None, listing: str = "domains") -> Path:
    """OUT/prompt_template.txt: a copy of `prompt_template`, or the compact template keeping the placeholder of
    `listing` (router_r1/pool/listing.py), so that whoever prompts the router lists the pool it calls."""
    template = out / "prompt_template.txt"
    if prompt_template:
        if Path(prompt_template).resolve() != template.resolve():
            template.write_text(Path(prompt_template).read_text())
    else:
        compact = load_template(COMPACT_TEMPLATE)
        template.write_text(fill_template(compact, **{LISTINGS["domains"]: "{" + LISTINGS[listing] + "}"}))
    return template


def run(recipe) -> dict:
    """Write the oracle parquet, the template (and tokenizer, model config); return what was written."""
    import pandas as pd

    from sim.embedded import build_tokenizer, write_model_config

    cfg = recipe.build
    if not cfg.out_dir:
        raise ValueError("--out-dir is required: where the oracle rows are written")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    template = own_template(out, cfg.prompt_template, recipe.listing_style.listing)
    t0 = time.perf_counter()
    built = build_rows(recipe, template)
    rows = built.rows
    pd.DataFrame(rows).to_parquet(out / "oracle.parquet", index=False)
    written = {"oracle": str(out / "oracle.parquet"), "template": str(template), "rows": len(rows),
               "data_s": time.perf_counter() - t0}
    tok = None
    if cfg.tokenizer:
        t1 = time.perf_counter()
        corpus = [chat_text(r["prompt"]) for r in rows] + [r["response_text"] for r in rows] + replies(built)
        # Model names (the bank's too) and the world's names as single tokens: shorter sequences, one-step copies.
        world = built.ctx.world
        models = ModelRegistry.from_yaml(cfg.pool).names + bank_names(recipe, world)
        words = recipe.names.token_words(world, models) + list(built.routes.words)
        tok = build_tokenizer(out / "tokenizer", corpus, cfg.vocab_size, extra_words=words)
        write_model_config(out / "model.json", tok, json.loads(cfg.model) if cfg.model else None,
                           recipe.names.frozen_ids(tok, world))
        written.update(tokenizer=str(out / "tokenizer"), model=str(out / "model.json"),
                       tokenizer_s=time.perf_counter() - t1)
    if cfg.report:
        written["report"] = report(rows, tok, built.routes)
    return written
