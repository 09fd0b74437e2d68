"""Build the router's train/val/test parquet files from the FlashRAG QA collection.

    python -m data_process.build_qa --out-dir data/router_r1                 # from the hub
    python -m data_process.build_qa --local-dir /data/flashrag --out-dir ...  # DIR/<name>/<split>.jsonl

Defaults follow the paper: NQ + HotpotQA train, 7,000 each (seed 42); validation 100 +
100; test 500 each of NQ, TriviaQA, PopQA, HotpotQA, 2WikiMultiHopQA, Musique and all of
Bamboogle. Draws from the same source split never overlap (HotpotQA's val and test both
come from its dev split), and the test draws come first, so the test sets do not change
when the train or val sizes do.
"""
from __future__ import annotations

import argparse
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from data_process.schema import DataBuildError, check_columns, clean_answers, input_problem, make_row, validate_row
from router_r1.pool.registry import ModelRegistry, RegistryError
from router_r1.prompts import TemplateError, build_router_prompt, load_template

HUB_ID = "RUC-NLPIR/FlashRAG_datasets"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POOL = REPO_ROOT / "configs" / "pool" / "paper.yaml"

TRAIN_SOURCES = ("nq", "hotpotqa")
VAL_SETS = {"nq": "dev", "hotpotqa": "dev"}
# FlashRAG has no test split for the multi-hop sets; their dev split is the test set.
TEST_SETS = {"nq": "test", "triviaqa": "test", "popqa": "test", "hotpotqa": "dev",
             "2wikimultihopqa": "dev", "musique": "dev", "bamboogle": "test"}


@dataclass(frozen=True)
class Draw:
    """`size` rows (None: all) of `source`/`source_split` for the output split `split`."""

    split: str  # train | val | test
    source: str  # FlashRAG config name, also the rows' data_source
    source_split: str
    size: int | None


@dataclass(frozen=True)
class QAItem:
    """One usable input row."""

    source_id: str  # the FlashRAG id (its row number if the file has none)
    question: str
    answers: list[str]


@dataclass
class BuildConfig:
    out_dir: str | Path
    local_dir: str | Path | None = None  # None: load from the hub
    cache_dir: str | Path | None = None  # datasets cache; None: its default
    pool: str | Path = DEFAULT_POOL
    include_unseen: bool = False  # the prompt lists the paper's unseen models too
    turn_budget: int | None = None
    prompt_template: str | Path | None = None
    seed: int = 42
    train_size: int = 7000
    val_size: int = 100
    test_size: int = 500
    bamboogle_size: int | None = None  # None: all 125
    strict: bool = False


@dataclass
class BuildReport:
    files: dict[str, int] = field(default_factory=dict)  # written path -> rows
    skipped: dict[str, Counter] = field(default_factory=dict)  # "nq/train" -> {reason: count}
    warnings: list[str] = field(default_factory=list)


def default_draws(cfg: BuildConfig) -> list[Draw]:
    """The paper's data: tests first (see the module docstring), then val, then train."""
    draws = [Draw("test", s, sp, cfg.bamboogle_size if s == "bamboogle" else cfg.test_size)
             for s, sp in TEST_SETS.items()]
    draws += [Draw("val", s, sp, cfg.val_size) for s, sp in VAL_SETS.items()]
    draws += [Draw("train", s, "train", cfg.train_size) for s in TRAIN_SOURCES]
    return draws


def load_split(source: str, split: str, local_dir=None, cache_dir=None):
    """One FlashRAG split as a datasets.Dataset, and a description of where it came from."""
    import datasets

    cache = str(cache_dir) if cache_dir else None
    if local_dir is None:
        where = f"{HUB_ID} {source}/{split}"
        try:
            return datasets.load_dataset(HUB_ID, source, split=split, cache_dir=cache), where
        except Exception as e:  # network, auth and missing-config errors come in many types
            raise DataBuildError(f"{where}: cannot load ({e}); without the hub, use --local-dir DIR "
                                 f"holding DIR/{source}/{split}.jsonl") from e
    base = Path(local_dir) / source
    for ext, builder in (("jsonl", "json"), ("parquet", "parquet")):
        path = base / f"{split}.{ext}"
        if path.is_file():
            where = f"{source}/{split} ({path})"
            try:
                return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache), where
            except Exception as e:  # arrow and json raise several types for a bad file
                raise DataBuildError(f"{where}: cannot read ({e})") from e
    raise DataBuildError(f"{source}/{split}: neither {base / (split + '.jsonl')} nor {base / (split + '.parquet')} exists")


def usable_items(ds, where: str, strict: bool) -> tuple[list[QAItem], Counter]:
    """The rows with a question and gold answers, and a count of the others by reason."""
    check_columns(ds.column_names, where)
    ids = list(ds["id"]) if "id" in ds.column_names else [None] * len(ds)
    items, bad = [], Counter()
    for i, (question, answers, rid) in enumerate(zip(ds["question"], ds["golden_answers"], ids)):
        problem = input_problem(question, answers)
        if problem is not None:
            if strict:
                raise DataBuildError(f"{where}: row {i}: {problem} (--strict)")
            bad[problem] += 1
            continue
        items.append(QAItem(str(i if rid is None else rid), question.strip(), clean_answers(answers)))
    return items, bad


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
    prompter = make_prompter(cfg.pool, cfg.include_unseen, cfg.prompt_template, cfg.turn_budget)
    report = BuildReport()
    outputs: dict[str, list[dict]] = {}

    groups: dict[tuple[str, str], list[Draw]] = {}
    for d in draws:
        groups.setdefault((d.source, d.source_split), []).append(d)
    for (source, source_split), group in groups.items():
        ds, where = load_split(source, source_split, cfg.local_dir, cfg.cache_dir)
        items, bad = usable_items(ds, where, cfg.strict)
        if bad:
            report.skipped[f"{source}/{source_split}"] = bad
        if not items:
            raise DataBuildError(f"{where}: no usable rows ({sum(bad.values())} bad)")
        order = source_permutation(len(items), cfg.seed, source, source_split)
        start = 0
        for d in group:
            want = len(items) - start if d.size is None else d.size
            take = np.sort(order[start:start + want])  # file order; the trainer shuffles
            start += len(take)
            if len(take) == 0:
                raise DataBuildError(f"{d.split}: {source}/{source_split} has no rows left for this draw "
                                     f"({len(items)} usable, all taken by the draws before it)")
            if len(take) < want:
                msg = (f"{d.split}: {source}/{source_split} has {len(take)} rows left of the {want} asked "
                       f"({len(items)} usable); taking all {len(take)}")
                report.warnings.append(msg)
                print(f"warning: {msg}", file=sys.stderr)
            rows = outputs.setdefault(out_name(d), [])
            for index, k in enumerate(take.tolist()):
                item = items[k]
                row = make_row(source, d.split, index, item.question, item.answers, prompter(item.question),
                               source_split, item.source_id)
                validate_row(row, f"{out_name(d)}: {source} row {index}")
                rows.append(row)

    report.files = write_parquets(cfg.out_dir, outputs)
    return report


def print_summary(report: BuildReport) -> None:
    for path, n in report.files.items():
        print(f"wrote {path}: {n} rows")
    for where, bad in report.skipped.items():
        reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(bad.items()))
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
    p.add_argument("--local-dir", default=None, help="read DIR/<name>/<split>.jsonl (or .parquet) instead of the hub")
    p.add_argument("--cache-dir", default=None, help="datasets cache directory")
    p.add_argument("--pool", default=str(DEFAULT_POOL), help="pool yaml whose models the prompt lists")
    p.add_argument("--include-unseen", action="store_true", help="also list the models marked unseen")
    p.add_argument("--turn-budget", type=budget_arg, default=None, help="state a routing-turn budget in every prompt")
    p.add_argument("--prompt-template", default=None, help="template file with {question} (and {pool}, {budget})")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--train-size", type=size_arg, default=7000, help="rows per train source (NQ, HotpotQA)")
    p.add_argument("--val-size", type=size_arg, default=100, help="rows per val source (NQ, HotpotQA)")
    p.add_argument("--test-size", type=size_arg, default=500, help="rows per test source, Bamboogle aside")
    p.add_argument("--bamboogle-size", type=size_arg, default=None, help="Bamboogle test rows (default: all)")
    p.add_argument("--strict", action="store_true", help="a bad input row is an error instead of skipped")
    return BuildConfig(**vars(p.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        report = build(cfg)
    except (DataBuildError, TemplateError, RegistryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_summary(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
