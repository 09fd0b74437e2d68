"""A warm-start recipe: the builder's settings and its augmentations', read from a yaml under configs/recipes/.

The yaml's top-level keys are BuildConfig fields (n, noise, pool, ...) and augmentation sections, each a mapping
of that augmentation's fields:

    noise: 0.05
    names: {rename: 1.0, whole_names: true}

A key that is neither, or a field an augmentation lacks, is an error naming the file and the key. Every field is
also a flag (router_r1/flags.py), which overrides the recipe's value; field names are unique across sections.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

from data_process.build_qa import REPO_ROOT
from router_r1.flags import add_flags
from sim.warm_start.alpha import PerAlphaRoutes
from sim.warm_start.budget import TurnBudgets
from sim.warm_start.build import BuildConfig, Context, HopRoutes, Routes
from sim.warm_start.listings import Fallback, ListingStyle, Rivals, ThinkCandidates, VariedListings
from sim.warm_start.misname import MisnameDrill
from sim.warm_start.names import Names
from sim.warm_start.oracle import Habits
from sim.warm_start.uniform import Annotator

RECIPES = REPO_ROOT / "configs" / "recipes"
# recipe section -> its augmentation (the order of --help and of the cross-checks)
AUGMENTATIONS: dict[str, type] = {
    "habits": Habits, "names": Names, "varied_listings": VariedListings, "rivals": Rivals,
    "thinking": ThinkCandidates, "fallback": Fallback, "misname_drill": MisnameDrill,
    "per_alpha": PerAlphaRoutes, "turn_budgets": TurnBudgets, "listing_style": ListingStyle,
    "annotator": Annotator,
}
SECTIONS: dict[str, type] = {"build": BuildConfig, **AUGMENTATIONS}


class RecipeError(ValueError):
    """A recipe file that cannot be read as one."""


def _owners() -> dict[str, str]:
    owner = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.name in owner:  # one flag per name
                raise TypeError(f"field {f.name!r} is in both {owner[f.name]} and {section}")
            owner[f.name] = section
    return owner


OWNER = _owners()  # field name -> its section


@dataclass
class Recipe:
    """The builder's settings and each augmentation's; building it runs every cross-check."""

    build: BuildConfig
    habits: Habits = field(default_factory=Habits)
    names: Names = field(default_factory=Names)
    varied_listings: VariedListings = field(default_factory=VariedListings)
    rivals: Rivals = field(default_factory=Rivals)
    thinking: ThinkCandidates = field(default_factory=ThinkCandidates)
    fallback: Fallback = field(default_factory=Fallback)
    misname_drill: MisnameDrill = field(default_factory=MisnameDrill)
    per_alpha: PerAlphaRoutes = field(default_factory=PerAlphaRoutes)
    turn_budgets: TurnBudgets = field(default_factory=TurnBudgets)
    listing_style: ListingStyle = field(default_factory=ListingStyle)
    annotator: Annotator = field(default_factory=Annotator)

    def __post_init__(self):
        for section in AUGMENTATIONS:
            check = getattr(getattr(self, section), "check", None)
            if check is not None:
                check(self)

    @property
    def hop_routes(self) -> bool:
        """Whether rows are the hop-by-hop oracle's (no other route source is on)."""
        return not (self.per_alpha.on or self.turn_budgets.on or self.annotator.on)

    def routes(self, ctx: Context) -> Routes:
        if self.per_alpha.on:
            return self.per_alpha.routes(ctx)
        if self.turn_budgets.on:
            return self.turn_budgets.routes(ctx)
        if self.annotator.on:
            return self.annotator.routes_of(ctx)
        return HopRoutes(self, ctx)

    def changes(self) -> list[str]:
        """'section.field=value' for every value off its default."""
        out = []
        for section, cls in SECTIONS.items():
            given, default = getattr(self, section), cls() if section != "build" else BuildConfig()
            out += [f"{section}.{f.name}={getattr(given, f.name)!r}" for f in dataclasses.fields(cls)
                    if getattr(given, f.name) != getattr(default, f.name) and f.name != "out_dir"]
        return out


def from_sections(sections: dict[str, dict]) -> Recipe:
    """A recipe from {section: {field: value}}."""
    return Recipe(**{s: SECTIONS[s](**sections.get(s, {})) for s in SECTIONS})


def make_recipe(**values) -> Recipe:
    """A recipe from flat field values (`make_recipe(out_dir=..., n=80, rename=1.0)`), each to its section."""
    unknown = sorted(set(values) - set(OWNER))
    if unknown:
        raise RecipeError(f"no recipe field named {', '.join(unknown)}")
    sections: dict[str, dict] = {}
    for name, value in values.items():
        sections.setdefault(OWNER[name], {})[name] = value
    return from_sections(sections)


def recipe_path(name: str | Path) -> Path:
    """`name` as a path (from here, else from the repository root), else configs/recipes/NAME.yaml."""
    path = Path(name)
    if path.is_file():
        return path
    if not path.is_absolute() and (REPO_ROOT / path).is_file():
        return REPO_ROOT / path
    if (RECIPES / f"{name}.yaml").is_file():
        return RECIPES / f"{name}.yaml"
    known = ", ".join(sorted(p.stem for p in RECIPES.glob("*.yaml")))
    raise RecipeError(f"recipe {name}: no such file, nor configs/recipes/{name}.yaml (there: {known})")


def _typed(value, tp, where: str):
    """`value` as the field type `tp` wants it (an int where a float goes becomes a float), else a RecipeError."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union:
        return None if value is None else _typed(value, args[0], where)
    if typing.get_origin(tp) is list:
        if not isinstance(value, list):
            raise RecipeError(f"{where}: expected a list, got {value!r}")
        return [_typed(v, typing.get_args(tp)[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise RecipeError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def load_sections(path: str | Path) -> dict[str, dict]:
    """{section: {field: value}} of a recipe yaml; an unknown key or a mistyped value names the file and the key."""
    import yaml

    path = recipe_path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not yaml ({e})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of settings and augmentation sections")
    sections: dict[str, dict] = {}
    for key, value in data.items():
        if key in AUGMENTATIONS:
            cls = AUGMENTATIONS[key]
            if not isinstance(value, dict):
                raise RecipeError(f"{path}: {key}: expected a mapping of {key}'s fields, got {value!r}")
            hints, names = typing.get_type_hints(cls), [f.name for f in dataclasses.fields(cls)]
            for name, v in value.items():
                if name not in names:
                    raise RecipeError(f"{path}: {key}.{name} is not a field of {key} (its fields: {', '.join(names)})")
                sections.setdefault(key, {})[name] = _typed(v, hints[name], f"{path}: {key}.{name}")
        elif OWNER.get(key) == "build":
            value = _typed(value, typing.get_type_hints(BuildConfig)[key], f"{path}: {key}")
            if key in ("pool", "prompt_template") and value and not Path(value).exists() \
                    and (REPO_ROOT / value).exists():  # a recipe's paths are the repository's, wherever it runs
                value = str(REPO_ROOT / value)
            sections.setdefault("build", {})[key] = value
        else:
            hint = f" (it belongs in the {OWNER[key]} section)" if key in OWNER else ""
            raise RecipeError(f"{path}: unknown key {key!r}{hint}; a recipe takes the builder's settings "
                              f"({', '.join(f.name for f in dataclasses.fields(BuildConfig))}) and the sections "
                              f"{', '.join(AUGMENTATIONS)}")
    return sections


def parser(prog: str = "python -m sim.warm_start") -> argparse.ArgumentParser:
    """--recipe, then one flag per field of the builder and of each augmentation; a flag not given keeps the
    recipe's value (a bool's flag has its opposite too: --no-whole-names undoes a recipe's whole_names)."""
    p = argparse.ArgumentParser(
        prog=prog, description="Oracle trajectories on the simulated world (the router's supervised warm start), "
        "written to OUT_DIR: oracle.parquet, prompt_template.txt, the tokenizer and model.json.",
        epilog="A flag overrides the recipe's value; each on/off flag has its opposite (--no-whole-names, "
        "--no-each-alpha, --tokenizer, ...) to undo a recipe's. Recipes: configs/recipes/.")
    p.add_argument("--recipe", metavar="YAML", help="the recipe (a yaml, or NAME for configs/recipes/NAME.yaml) whose "
                   "values the flags override (default: none, every augmentation off)")
    add_flags(p, BuildConfig)
    for section, cls in AUGMENTATIONS.items():
        add_flags(p.add_argument_group(section, (cls.__doc__ or "").strip()), cls)
    for cls in SECTIONS.values():
        for f in dataclasses.fields(cls):
            if f.type in ("bool", bool):
                flag = f.name.replace("_", "-")
                opposite = f"--{flag}" if f.default else f"--no-{flag}"
                p.add_argument(opposite, dest=f.name, action="store_true" if f.default else "store_false",
                               help=argparse.SUPPRESS)
    for action in p._actions:  # not given: absent from the namespace, so the recipe's value stands
        if action.dest != "help":
            action.default = argparse.SUPPRESS
    return p


def parse_args(argv: list[str] | None = None) -> Recipe:
    """The recipe of --recipe (if any) with the given flags over it."""
    args = vars(parser().parse_args(argv))
    path = args.pop("recipe", None)
    sections = load_sections(path) if path else {}
    for name, value in args.items():
        sections.setdefault(OWNER[name], {})[name] = value
    return from_sections(sections)
