"""The warm-start CLI: `python -m sim.warm_start --recipe configs/recipes/default.yaml --out-dir DIR [flags]`."""
from __future__ import annotations

from data_process.schema import DataBuildError
from router_r1.flags import run_command
from router_r1.pool.registry import RegistryError
from router_r1.prompts import TemplateError
from sim.warm_start.build import run
from sim.warm_start.recipe import parse_args


def build(argv: list[str] | None) -> dict:
    """The recipe of `argv`, said, then built."""
    recipe = parse_args(argv)
    print("recipe: " + (", ".join(recipe.changes()) or "the bare oracle"), flush=True)
    return run(recipe)


def print_written(written: dict) -> None:
    print(f"wrote {written['oracle']}: {written['rows']} rows ({written['data_s']:.1f}s); "
          f"template {written['template']}")
    if "tokenizer" in written:
        print(f"wrote {written['tokenizer']} and {written['model']} ({written['tokenizer_s']:.1f}s)")
    if "report" in written:
        print(written["report"])


def main(argv: list[str] | None = None) -> int:
    """Parse, build, print what was written (errors as one line, exit 1)."""
    return run_command(lambda: build(argv), (DataBuildError, TemplateError, RegistryError, ValueError), print_written)
