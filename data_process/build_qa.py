"""Build the router's train/val/test parquet files from QA files (FlashRAG's collection or your own).

    python -m data_process.build_qa --out-dir data/router_r1                 # from the hub
    python -m data_process.build_qa --local-dir /data/flashrag --out-dir ...  # DIR/<name>/<split>.jsonl
    python -m data_process.build_qa --local-dir my_qa --sources hotpotqa,mine:dev --splits test
    python -m data_process.build_qa --sources hotpotqa=eval/hotpotqa_500.jsonl,2wiki=eval/2wiki_500.jsonl

Defaults follow the paper: NQ + HotpotQA train, 7,000 each (seed 42); validation 100 +
100; test 500 each of NQ, TriviaQA, PopQA, HotpotQA, 2WikiMultiHopQA, Musique and all of
Bamboogle. Draws from the same source split never overlap (HotpotQA's val and test both
come from its dev split), and the test draws come first, so the test sets do not change
when the train or val sizes do. A source file smaller than its draws ask for is shared
among them in proportion (with a warning); one with fewer rows than draws is an error
before anything is drawn. `--sources` / `--splits` build a subset; a source name that is
not one of the paper's sets is a test set (DIR/<name>/test.jsonl, or <name>:<split>), and
`--train-sources` / `--val-sources` name your own training and validation sets. A source is
read from DIR/<name>/<split>.jsonl, else the flat DIR/<name>.jsonl (or .parquet), or from
the file NAME=PATH names; draws that read one file share it without overlap. Input rows are
read as plain JSON (see data_process/qa_files.py for the answer layouts), or in veRL's RL
layout as Search-R1's and veRL's recipes write it (router_r1/qa_rows.py); a row keeps the
file's own `id` (or `uid`, R1-Searcher's `idx`, extra_info's index) as its source_id.
Repeated questions or ids are reported; a question over --max-question-chars is a bad row.
"""
from __future__ import annotations

import argparse
import re
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from data_process.qa_files import QUESTION_KEY, RawRow, columns_of, gold_key, gold_list, read_file
from data_process.schema import (DataBuildError, clean_answers, golds_problem, id_problem, make_row, question_problem,
                                  validate_row)
from router_r1.flags import run_command
from router_r1.pool import listing
from router_r1.pool.registry import ModelRegistry, RegistryError
from router_r1.prompts import TemplateError, build_router_prompt, load_template
from router_r1.qa_rows import MAX_QUESTION_CHARS, is_rl_layout, question_of, repeats, row_id, target_of, too_long

HUB_ID = "RUC-NLPIR/FlashRAG_datasets"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POOL = REPO_ROOT / "configs" / "pool" / "paper.yaml"

TRAIN_SOURCES = ("nq", "hotpotqa")
VAL_SETS = {"nq": "dev", "hotpotqa": "dev"}
# FlashRAG has no test split for the multi-hop sets; their dev split is the test set.
TEST_SETS = {"nq": "test", "triviaqa": "test", "popqa": "test", "hotpotqa": "dev",
             "2wikimultihopqa": "dev", "musique": "dev", "bamboogle": "test"}
SPLITS = ("train", "val", "test")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a source name becomes a file name (test_<name>.parquet)


@dataclass(frozen=True)
class Draw:
    """`size` rows (None: all) of `source`/`source_split` for the output split `split`."""

    split: str  # train | val | test
    source: str  # FlashRAG config name, also the rows' data_source
    source_split: str  # the input split; for a file outside DIR/<name>/<split>, the file's name
    size: int | None
    path: str | None = None  # the input file (NAME=PATH, or found under --local-dir); None: the hub


@dataclass(frozen=True)
class QAItem:
    """One usable input row."""

    source_id: str  # the file's own id (FlashRAG's `id`, R1-Searcher's `idx`; its row number if it has none)
    question: str
    answers: list[str]


@dataclass
class BuildConfig:
    out_dir: str | Path
    local_dir: str | Path | None = None  # None: load from the hub
    cache_dir: str | Path | None = None  # datasets cache; None: its default
    pool: str | Path | None = None  # None: DEFAULT_POOL; one given must be listed by the template (check_pool_listed)
    include_unseen: bool = False  # the prompt lists the paper's unseen models too
    turn_budget: int | None = None
    prompt_template: str | Path | None = None
    seed: int = 42
    train_size: int = 7000
    val_size: int = 100
    test_size: int = 500
    bamboogle_size: int | None = None  # None: all 125
    strict: bool = False
    max_question_chars: int = MAX_QUESTION_CHARS  # a longer question is a bad row
    sources: tuple[str, ...] | None = None  # NAME, NAME:SPLIT or NAME=PATH; None: the paper's sets
    train_sources: tuple[str, ...] | None = None  # NAME[:SPLIT] (split default train) or NAME=PATH; None: NQ + HotpotQA
    val_sources: tuple[str, ...] | None = None  # NAME[:SPLIT] (split default dev) or NAME=PATH; None: NQ + HotpotQA dev
    splits: tuple[str, ...] = SPLITS  # which output splits to build


@dataclass
class BuildReport:
    files: dict[str, int] = field(default_factory=dict)  # written path -> rows
    skipped: dict[str, Counter] = field(default_factory=dict)  # "nq/train" -> {reason: count}
    first_bad: dict[str, dict[str, str]] = field(default_factory=dict)  # "nq/train" -> {reason: "FILE line N"}
    mapped: dict[str, str] = field(default_factory=dict)  # "nq/train" -> where the question and golds came from
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SourceArg:
    """One --sources item: a name (the rows' data_source) and its split or its file (else None)."""

    split: str | None = None
    path: str | None = None


def parse_sources(names, flag: str = "--sources") -> dict[str, SourceArg]:
    """NAME, NAME:SPLIT or NAME=PATH items -> {name: SourceArg}; a name must be usable in a file name
    and appear once (each name is one data_source and one output file)."""
    out: dict[str, SourceArg] = {}
    given: dict[str, str] = {}
    for item in names:
        item = item.strip()
        name, eq, path = item.partition("=")
        if eq:
            if not path:
                raise DataBuildError(f"{flag}: {item!r} names no file after '='")
            arg = SourceArg(path=path)
        else:
            name, _, split = item.partition(":")
            if split and not _NAME.fullmatch(split):
                raise DataBuildError(f"{flag}: {item!r} is not NAME, NAME:SPLIT or NAME=PATH (letters, digits, _ . -)")
            arg = SourceArg(split=split or None)
        if not _NAME.fullmatch(name):
            raise DataBuildError(f"{flag}: {item!r} is not NAME, NAME:SPLIT or NAME=PATH (letters, digits, _ . -)")
        if name in out:
            raise DataBuildError(f"{flag}: source {name!r} is given twice ({given[name]}, {item}); a name is one "
                                 f"data_source and one output file: give each file its own name, as in "
                                 f"{name}_a=FILE_A.jsonl,{name}_b=FILE_B.jsonl")
        out[name], given[name] = arg, item
    return out


def default_draws(cfg: BuildConfig) -> list[Draw]:
    """The paper's data (or the --sources/--splits subset, and your own --train-sources/--val-sources):
    tests first (see the module docstring), then val, then train."""
    bad = [s for s in cfg.splits if s not in SPLITS]
    if bad or not cfg.splits:
        raise DataBuildError(f"--splits: {', '.join(bad) or 'none given'}; choose from {', '.join(SPLITS)}")
    wanted = None if cfg.sources is None else parse_sources(cfg.sources)
    tests = ({n: SourceArg(sp) for n, sp in TEST_SETS.items()} if wanted is None else
             {n: a if a.path else SourceArg(a.split or TEST_SETS.get(n, "test")) for n, a in wanted.items()})

    def role(given, flag: str, defaults: dict[str, str], split: str) -> dict[str, SourceArg]:
        # given explicitly: as given; else the paper's, less the sources --sources leaves out (a source
        # --sources names as NAME=PATH: that file, shared with the test draw, not the hub's split)
        if given is not None:
            return {n: a if a.path else SourceArg(a.split or split) for n, a in parse_sources(given, flag).items()}
        return {n: wanted[n] if wanted and wanted[n].path else SourceArg(sp)
                for n, sp in defaults.items() if wanted is None or n in wanted}

    def draw(split: str, name: str, arg: SourceArg, size: int | None) -> Draw:
        return Draw(split, name, Path(arg.path).name if arg.path else arg.split, size, arg.path)

    draws = []
    if "test" in cfg.splits:
        draws += [draw("test", s, a, cfg.bamboogle_size if s == "bamboogle" else cfg.test_size)
                  for s, a in tests.items()]
    if "val" in cfg.splits:
        draws += [draw("val", s, a, cfg.val_size)
                  for s, a in role(cfg.val_sources, "--val-sources", VAL_SETS, "dev").items()]
    if "train" in cfg.splits:
        train = role(cfg.train_sources, "--train-sources", dict.fromkeys(TRAIN_SOURCES, "train"), "train")
        draws += [draw("train", s, a, cfg.train_size) for s, a in train.items()]
    if not draws:
        raise DataBuildError(f"nothing to build: no {'/'.join(cfg.splits)} draw from sources "
                             f"{', '.join(wanted or ())} (train: {', '.join(TRAIN_SOURCES)} or --train-sources; "
                             f"val: {', '.join(VAL_SETS)} or --val-sources; test: any source)")
    return draws


def locate(draw: Draw, local_dir=None) -> Draw:
    """The draw with the file it reads: NAME=PATH's, else DIR/<name>/<split>.jsonl|.parquet, else the flat
    DIR/<name>.jsonl|.parquet (then source_split is the file's name); without --local-dir, the hub's."""
    if draw.path is not None:
        if not Path(draw.path).is_file():
            raise DataBuildError(f"{draw.source}={draw.path}: file not found")
        return draw
    if local_dir is None:
        return draw
    base = Path(local_dir) / draw.source
    tried = [base / f"{draw.source_split}.{ext}" for ext in ("jsonl", "parquet")]
    flat = [Path(local_dir) / f"{draw.source}.{ext}" for ext in ("jsonl", "parquet")]
    for path in tried + flat:
        if path.is_file():
            split = draw.source_split if path in tried else path.name
            return Draw(draw.split, draw.source, split, draw.size, str(path))
    raise DataBuildError(f"{draw.source}/{draw.source_split}: none of " + ", ".join(map(str, tried + flat))
                         + f" exists (or name the file: --sources {draw.source}=PATH)")


def load_rows(draw: Draw, cache_dir=None) -> tuple[list[RawRow], str]:
    """The rows a located draw reads (its file, else the hub), each named by file and line, and a
    description of where they came from."""
    where = f"{draw.source}/{draw.source_split}"
    if draw.path is not None:
        try:
            return read_file(Path(draw.path)), f"{where} ({draw.path})"
        except OSError as e:
            raise DataBuildError(f"{where} ({draw.path}): cannot read ({e})") from e
    import datasets

    where = f"{HUB_ID} {where}"
    try:
        ds = datasets.load_dataset(HUB_ID, draw.source, split=draw.source_split,
                                   cache_dir=str(cache_dir) if cache_dir else None)
    except Exception as e:  # network, auth and missing-config errors come in many types
        raise DataBuildError(f"{where}: cannot load ({e}); without the hub, use --local-dir DIR "
                             f"holding DIR/{draw.source}/{draw.source_split}.jsonl, or "
                             f"--sources {draw.source}=FILE") from e
    return [RawRow(f"{where} row {i}", rec) for i, rec in enumerate(ds.to_list())], where


@dataclass
class Usable:
    """The usable rows of one source split, what was skipped (by reason), and how the golds were read."""

    items: list[QAItem]
    bad: Counter
    first_bad: dict[str, str]  # reason -> where it first happened
    mapped: str
    repeats: list[str] = field(default_factory=list)  # warnings: questions or ids that repeat among the items


def usable_items(rows: list[RawRow], where: str, strict: bool,
                 max_question_chars: int = MAX_QUESTION_CHARS) -> Usable:
    """The rows with a question and gold answers, and a count of the others by reason: plain QA rows (`question`
    and a gold column), or veRL's RL layout (router_r1/qa_rows.py).

    Every message names the file and line; with `strict` the first bad row is an error."""
    columns = columns_of(rows)
    key = gold_key(rows)
    rl = is_rl_layout(columns)
    if not rows:
        raise DataBuildError(f"{where}: the file is empty (no rows)")
    if all(r.record is None for r in rows):
        pass  # every line unreadable: counted below, then "no usable rows"
    elif not rl and QUESTION_KEY not in columns:
        raise DataBuildError(f"{where}: missing column {QUESTION_KEY!r} (columns: {', '.join(columns)}); a file in "
                             "veRL's RL layout has reward_model, and extra_info.question or a prompt")
    elif not rl and key is None:
        raise DataBuildError(f"{where}: missing column 'golden_answers' (or 'answers' / 'answer'; "
                             f"columns: {', '.join(columns)})")
    items, bad, first, places, own_ids = [], Counter(), {}, [], []
    shapes: dict[tuple[str, str], Counter] = {}  # (question field, gold field) -> {shape: rows}
    for i, r in enumerate(rows):
        problem, rec = r.problem, r.record
        if problem is None:
            (question, asked), (value, gold) = ((question_of(rec), target_of(rec)) if rl else
                                                ((rec.get(QUESTION_KEY), QUESTION_KEY), (rec.get(key), key)))
            golds, shape = gold_list(value, gold) if value is not None else (None, f"missing {gold}")
            problem = (question_problem(question) or too_long(question, max_question_chars)
                       or (shape if golds is None else golds_problem(golds, gold)) or id_problem(row_id(rec)))
        if problem is not None:
            if strict:
                raise DataBuildError(f"{r.where}: {problem} (--strict)")
            reason = problem.split(" (")[0]  # the detail (byte, column) stays in first_bad's message
            bad[reason] += 1
            first.setdefault(reason, r.where)
            continue
        shapes.setdefault((asked, gold), Counter())[shape] += 1
        rid = row_id(rec)
        items.append(QAItem(str(i) if rid is None else rid, question.strip(), clean_answers(golds)))
        places.append(" ".join(r.where.split(" ")[-2:]))  # "line 7" / "row 6"
        own_ids.append(rid)
    mapped = "; ".join(f"question from {asked!r}, golds from {gold!r} (" + ", ".join(
        f"{n} rows: {shape}" for shape, n in counts.most_common()) + ")" for (asked, gold), counts in shapes.items())
    found = [repeats([it.question for it in items], places, "question"), repeats(own_ids, places, "id")]
    return Usable(items, bad, first, mapped, [f"{where}: {w}" for w in found if w])


def plan_sizes(n: int, draws: list[Draw], where: str) -> tuple[list[int], str | None]:
    """How many rows each draw of one source split takes (in draw order), and a warning when the file
    is smaller than asked: then each draw gets a share in proportion to its ask (at least one row)."""
    fixed = sum(d.size for d in draws if d.size is not None)
    asked = [d.size if d.size is not None else max(n - fixed, 0) for d in draws]  # None: all the rest
    if sum(asked) <= n and all(asked):
        return asked, None
    if n < len(draws):
        raise DataBuildError(f"{where}: {n} usable rows cannot feed {len(draws)} draws "
                             f"({', '.join(d.split for d in draws)}); build fewer (--splits, --sources) "
                             "or give a larger file")
    want = [d.size if d.size is not None else n for d in draws]
    quota = [n * w / sum(want) for w in want]
    takes = [max(1, int(q)) for q in quota]
    by_remainder = sorted(range(len(draws)), key=lambda i: takes[i] - quota[i])
    for i in by_remainder[:max(0, n - sum(takes))]:  # largest remainders first
        takes[i] += 1
    while sum(takes) > n:  # the minimum of one row overshot: take back from the largest
        takes[takes.index(max(takes))] -= 1
    asks = ", ".join(f"{d.split} {'all' if d.size is None else d.size}" for d in draws)
    gets = ", ".join(f"{d.split} {t}" for d, t in zip(draws, takes))
    return takes, (f"{where} has {n} usable rows for draws asking {asks}; drawing {gets} "
                   "(in proportion; set the sizes to choose)")


def source_permutation(n: int, seed: int, source: str, split: str) -> np.ndarray:
    """A seed-fixed order of a source split's usable rows; crc32 keeps it stable across runs."""
    return np.random.default_rng([seed, zlib.crc32(f"{source}/{split}".encode())]).permutation(n)


def out_name(draw: Draw) -> str:
    return f"test_{draw.source}.parquet" if draw.split == "test" else f"{draw.split}.parquet"


def make_prompter(pool, include_unseen: bool = False, prompt_template=None,
                  turn_budget: int | None = None) -> Callable[[str], list[dict[str, str]]]:
    """question -> router chat messages, over the pool's seen models (all with include_unseen)."""
    registry = ModelRegistry.from_yaml(pool)
    registry = registry if include_unseen else registry.seen()
    template = load_template(prompt_template) if prompt_template else None
    # a template without {budget} but a budget given fails here, before any data is loaded
    build_router_prompt("probe", registry, template, turn_budget)
    return lambda question: build_router_prompt(question, registry, template, turn_budget)


def check_pool_listed(cfg: BuildConfig) -> None:
    """A pool (or --include-unseen) given for a template that lists no pool would change nothing: refused."""
    if cfg.prompt_template is None or (cfg.pool is None and not cfg.include_unseen):
        return
    if not listing.styles_in(load_template(cfg.prompt_template)):
        flag = f"--pool {cfg.pool}" if cfg.pool is not None else "--include-unseen"
        keys = ", ".join("{" + k + "}" for k in listing.LISTINGS.values())
        raise DataBuildError(f"{flag}: the prompt template {cfg.prompt_template} has no pool placeholder ({keys}), so "
                             "no prompt would list the pool's models (they list what the template's text names); drop "
                             "the flag, or give a template with one")


def write_parquets(out_dir, outputs: dict[str, list[dict]]) -> dict[str, int]:
    """Write each file name's rows under out_dir (train, val, then the rest by name)."""
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    first = {"train.parquet": 0, "val.parquet": 1}
    written = {}
    for name, rows in sorted(outputs.items(), key=lambda kv: (first.get(kv[0], 2), kv[0])):
        path = out_dir / name
        pd.DataFrame(rows).to_parquet(path, index=False)
        written[str(path)] = len(rows)
    return written


def build(cfg: BuildConfig, draws: list[Draw] | None = None) -> BuildReport:
    """Load, clean, sample, prompt and write every parquet file; return what was done."""
    draws = default_draws(cfg) if draws is None else draws
    check_pool_listed(cfg)
    prompter = make_prompter(cfg.pool or DEFAULT_POOL, cfg.include_unseen, cfg.prompt_template, cfg.turn_budget)
    report = BuildReport()
    outputs: dict[str, list[dict]] = {}

    groups: dict[tuple, list[Draw]] = {}  # draws that read one file (or hub split) share its rows
    for d in (locate(d, cfg.local_dir) for d in draws):
        key = ("file", str(Path(d.path).resolve())) if d.path else ("hub", d.source, d.source_split)
        groups.setdefault(key, []).append(d)
    plans = []  # every file is read and every size planned before anything is drawn
    for group in groups.values():
        first = group[0]
        rows, where = load_rows(first, cfg.cache_dir)
        usable = usable_items(rows, where, cfg.strict, cfg.max_question_chars)
        name = f"{first.source}/{first.source_split}"
        report.mapped[name] = usable.mapped
        if usable.bad:
            report.skipped[name], report.first_bad[name] = usable.bad, usable.first_bad
        if not usable.items:
            raise DataBuildError(f"{where}: no usable rows ({sum(usable.bad.values())} bad: "
                                 + ", ".join(f"{r}: {n}" for r, n in usable.bad.items()) + ")")
        takes, warning = plan_sizes(len(usable.items), group, where)
        for w in usable.repeats + [warning] * bool(warning):
            report.warnings.append(w)
            print(f"warning: {w}", file=sys.stderr)
        plans.append((group, usable.items, takes))

    for group, items, takes in plans:
        order = source_permutation(len(items), cfg.seed, group[0].source, group[0].source_split)
        start = 0
        for d, n in zip(group, takes):
            take = np.sort(order[start:start + n])  # file order; the trainer shuffles
            start += n
            rows = outputs.setdefault(out_name(d), [])
            for index, k in enumerate(take.tolist()):
                item = items[k]
                row = make_row(d.source, d.split, index, item.question, item.answers, prompter(item.question),
                               d.source_split, item.source_id)
                validate_row(row, f"{out_name(d)}: {d.source} row {index}")
                rows.append(row)

    report.files = write_parquets(cfg.out_dir, outputs)
    return report


def print_summary(report: BuildReport) -> None:
    for name, mapped in report.mapped.items():
        print(f"read {name}: {mapped}")
    for path, n in report.files.items():
        print(f"wrote {path}: {n} rows")
    for where, bad in report.skipped.items():
        reasons = ", ".join(f"{reason}: {n} (first at {report.first_bad[where][reason]})"
                            for reason, n in sorted(bad.items()))
        print(f"skipped {sum(bad.values())} bad rows of {where} ({reasons})")


def size_arg(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"a size must be >= 1, got {n}")
    return n


def budget_arg(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"the turn budget must be >= 0, got {n}")
    return n


def parse_args(argv: list[str] | None = None) -> BuildConfig:
    p = argparse.ArgumentParser(prog="python -m data_process.build_qa", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default="data/router_r1", help="where the parquet files go")
    p.add_argument("--local-dir", default=None, help="read DIR/<name>/<split>.jsonl, else DIR/<name>.jsonl (or "
                                                      ".parquet) instead of the hub")
    p.add_argument("--cache-dir", default=None, help="datasets cache directory")
    p.add_argument("--pool", default=None, help="pool yaml whose models the prompt lists (default: "
                                                 "configs/pool/paper.yaml); the template must list it ({pool})")
    p.add_argument("--include-unseen", action="store_true", help="also list the models marked unseen")
    p.add_argument("--turn-budget", type=budget_arg, default=None, help="state a routing-turn budget in every prompt")
    p.add_argument("--prompt-template", default=None, help="template file with {question} (and {pool}, {budget})")
    p.add_argument("--seed", type=int, default=42, help="seed of the row sampling and shuffling")
    p.add_argument("--train-size", type=size_arg, default=7000, help="rows per train source (NQ, HotpotQA)")
    p.add_argument("--val-size", type=size_arg, default=100, help="rows per val source (NQ, HotpotQA)")
    p.add_argument("--test-size", type=size_arg, default=500, help="rows per test source, Bamboogle aside")
    p.add_argument("--bamboogle-size", type=size_arg, default=None, help="Bamboogle test rows (default: all)")
    p.add_argument("--strict", action="store_true", help="a bad input row is an error instead of skipped")
    p.add_argument("--max-question-chars", type=size_arg, default=MAX_QUESTION_CHARS,
                   help=f"a longer question is a bad row (default {MAX_QUESTION_CHARS:,}; a QA question is a few "
                        "hundred characters)")
    p.add_argument("--sources", type=_csv, default=None, metavar="NAME[:SPLIT]|NAME=PATH,...",
                   help="build only these sources; a name not among the paper's sets is a test set read from "
                        "<name>/test (or <name>/SPLIT), or from the file PATH; each name once")
    p.add_argument("--splits", type=_csv, default=SPLITS, metavar="train,val,test", help="build only these splits")
    p.add_argument("--train-sources", type=_csv, default=None, metavar="NAME[:SPLIT]|NAME=PATH,...",
                   help="train on these (split default: train) instead of NQ + HotpotQA")
    p.add_argument("--val-sources", type=_csv, default=None, metavar="NAME[:SPLIT]|NAME=PATH,...",
                   help="validate on these (split default: dev) instead of NQ + HotpotQA dev")
    return BuildConfig(**vars(p.parse_args(argv)))


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    return run_command(lambda: build(cfg), (DataBuildError, TemplateError, RegistryError), print_summary)


if __name__ == "__main__":
    sys.exit(main())
