"""At start-up (infer.py, the server, evaluation, calibration): which models of the pool in use a trained router
was never trained to name, and a refusal where it was trained to name none of them.

The models a router was trained to name are its run's training pool: env.pool of its run_config.yaml (its seen
models under env.seen_only), or, for a warm start (SFT: no env), the models its rows route to. A
checkpoint whose template has no listing placeholder (one written before router_r1/pool/listing.py) lists the
models written into it, whatever the pool: it still loads, with a warning naming the pool's models it never shows.
"""
from __future__ import annotations

import re
from pathlib import Path

from router_r1.pool.listing import styles_in
from router_r1.pool.registry import ModelRegistry, ModelSpec, RegistryError, normalize_name
from router_r1.prompts import DEFAULT_TEMPLATE
from router_r1.runtime import EvalError, resolve_template
from verl.trainer.config import find_run_config, load_run_config

REPO_ROOT = Path(__file__).resolve().parents[1]
FLAG = "--allow-unseen-models"


def _keys(spec: ModelSpec) -> set[str]:
    return {normalize_name(n) for n in (spec.name, *spec.aliases)}


def training_pool(checkpoint: str | Path) -> tuple[dict[str, set[str]] | None, str]:
    """({name: its lookup keys} of the models the run at `checkpoint` was trained to name, where that was read), or
    (None, why not). A routing run's are its env.pool's; a warm start's (SFT: no env), the route_models of its
    data.sft_files."""
    run = load_run_config(checkpoint)
    if run is None:
        return None, f"{checkpoint} has no run_config.yaml"
    env = run.get("env")
    if env is not None and env.get("pool"):
        path = _path(env.pool)
        try:
            registry = ModelRegistry.from_yaml(path)
        except RegistryError as e:
            return None, f"its training pool cannot be read ({e})"
        registry = registry.seen() if env.get("seen_only", True) else registry
        where = f"env.pool {env.pool} of {find_run_config(checkpoint)}"
        return {s.name: _keys(s) for s in registry.models.values()}, where
    files = list((run.get("data") or {}).get("sft_files") or [])
    if not files:
        return None, f"{find_run_config(checkpoint)} names neither env.pool nor data.sft_files"
    import pandas as pd  # a warm start's rows: only here

    names: set[str] = set()
    for f in files:
        try:
            names.update(n for routes in pd.read_parquet(_path(f), columns=["route_models"])["route_models"]
                         for n in routes)
        except Exception as e:  # gone, or rows without route_models: say so, do not stop
            return None, f"its warm-start rows {f} cannot be read ({type(e).__name__}: {str(e)[:120]})"
    where = f"the routes of data.sft_files of {find_run_config(checkpoint)}"
    return {n: {normalize_name(n)} for n in sorted(names)}, where


def _path(name: str) -> Path:
    path = Path(name)
    return path if path.is_file() or path.is_absolute() else REPO_ROOT / path


def _written_in(template: str, pool: ModelRegistry) -> list[ModelSpec]:
    """The pool's models whose name or an alias a fixed template writes."""
    return [s for s in pool.models.values()
            if any(re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", template) for n in (s.name, *s.aliases))]


def check_trained_names(checkpoints, pool: ModelRegistry, template_file: str | None = None,
                        allow_unseen: bool = False, log=print) -> None:
    """Log, per checkpoint, the models of `pool` (those the router may call) it was never trained to name; EvalError
    when that is all of them, unless `allow_unseen` (--allow-unseen-models)."""
    for checkpoint in [checkpoints] if isinstance(checkpoints, (str, Path)) else list(checkpoints):
        template, source = resolve_template(template_file, Path(checkpoint))
        template = DEFAULT_TEMPLATE if template is None else template
        if not styles_in(template):
            shown = {s.name for s in _written_in(template, pool)}
            missing = [n for n in pool.names if n not in shown]
            log(f"WARNING: {source or 'the prompt template'} has no pool placeholder: it lists the models written into "
                "it at training, not the pool in use" + (f" (it never shows {', '.join(missing)})" if missing else "")
                + "; a template with one ({pool_domains}, {pool_card}) lists the pool the router calls")
        trained, where = training_pool(checkpoint)
        if trained is None:
            log(f"note: cannot tell which models {checkpoint} was trained to name: {where}")
            continue
        known = set().union(*trained.values())
        unseen = [s.name for s in pool.models.values() if not _keys(s) & known]
        if not unseen:
            continue
        knows = list(trained)[:8] + ([f"{len(trained) - 8} more"] if len(trained) > 8 else [])
        said = (f"{checkpoint} was never trained to name {', '.join(unseen)} of pool "
                f"{pool.source.removesuffix('[subset]')} (it knows {', '.join(knows) or 'none'}: {where})")
        if len(unseen) < len(pool):
            log(f"WARNING: {said}")
        elif allow_unseen:
            log(f"WARNING: {said}; it may route to none of them: going on ({FLAG})")
        else:
            raise EvalError(f"{said}: it cannot route to any model of this pool. Train it on this pool, or pass "
                            f"{FLAG} to run it anyway (a router trained on varied listings may copy a listed name)")
