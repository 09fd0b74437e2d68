"""The warm-start CLI: `python -m sim.warm_start --recipe configs/recipes/default.yaml --out-dir DIR [flags]`."""
from __future__ import annotations

import sys

from data_process.schema import DataBuildError
from router_r1.pool.registry import RegistryError
from router_r1.prompts import TemplateError
from sim.warm_start.build import run
from sim.warm_start.recipe import parse_args


def main(argv: list[str] | None = None) -> int:
    """Parse, build, print what was written (errors as one line, exit 1)."""
    try:
        recipe = parse_args(argv)
        print("recipe: " + (", ".join(recipe.changes()) or "the bare oracle"), flush=True)
        written = run(recipe)
    except (DataBuildError, TemplateError, RegistryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {written['oracle']}: {written['rows']} rows ({written['data_s']:.1f}s); "
          f"template {written['template']}")
    if "tokenizer" in written:
        print(f"wrote {written['tokenizer']} and {written['model']} ({written['tokenizer_s']:.1f}s)")
    if "report" in written:
        print(written["report"])
    return 0
