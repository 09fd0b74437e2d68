"""Evaluation report: per-source metrics with a bootstrap CI, console table, JSON, JSONL, Pareto PNG.

Input is a list of scored trajectory records (dicts made by router_r1.eval.evaluate), one
per question, with at least: data_source, em, f1, format_ok, cost_usd, cost_reward,
reward, route_count, pool_failures, hit_budget, models_called, and `turns` (a pool call's
turn carries ok, error, latency_s, cached).

Cost, per question: `cost_usd` is the reference Router-R1's (each call's completion tokens at the model's
output price; the table's `cost 1e-6$`), `billed_usd` what the APIs would bill (its prompt tokens, all the call
sends, at the input price too: the pool yaml's price_in_per_m; `billed 1e-6$`), `router_tokens` the tokens the
router generated itself (no price: it runs on your machine; `router tok`, "-" for a run without a policy),
`pool_prompt_tokens` / `pool_completion_tokens` the tokens the pool's calls read and wrote.

Pool health is reported per call, not per question: `pool_failure_rate` = failed calls /
calls, `pool_errors` counts the failures by kind, `pool_cut` / `pool_usage_capped` the replies cut at
`env.max_reply_chars` and those whose usage block claimed more than the call could use (counted at the
bound; router_r1/pool/client.py), and `pool_latency_p50_s` / `p95` (the
table's `call p50` / `call p95`) are over the calls that went to the pool (cache hits left
out; a failed call counts with the time it took to fail). That is the call's time as the
client saw it: waiting for a connection slot, every attempt and the backoff between, so a
busy client or retried calls raise it. `pool_server_p50_s` / `p95` (`srv p50`) are the
answering server's own times, where it reports one (our pool server's X-Latency-S header,
OpenAI's openai-processing-ms); `-` where none does.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from router_r1.pool.health import call_stats
from router_r1.routing_collapse import call_counts, domain_shares, shares_entropy
from router_r1.stages import STAGES, stage_rates

OVERALL = "overall"


def bootstrap_ci(values, n_resamples: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean: resample with replacement `n_resamples` times (seeded)."""
    x = np.asarray(values, dtype=np.float64)  # (n,)
    if x.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_resamples, x.size))  # (n_resamples, n)
    means = x[idx].mean(axis=1)  # (n_resamples,)
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(lo), float(hi)


def _mean(trajs: list[dict], key: str) -> float:
    return float(np.mean([float(t[key]) for t in trajs])) if trajs else math.nan


def _mean_given(trajs: list[dict], key: str) -> float:
    """The mean over the trajectories that carry `key`; nan when none does."""
    values = [float(t[key]) for t in trajs if t.get(key) is not None]
    return float(np.mean(values)) if values else math.nan


def _call_tokens(t: dict, key: str) -> int:
    """`key` (prompt_tokens, completion_tokens) summed over a trajectory's pool calls."""
    return sum(int(turn.get(key) or 0) for turn in t.get("turns", []) if "ok" in turn)


def pool_health(trajs: list[dict]) -> dict:
    """Calls, failure rate, failures by error kind, call time p50/p95 (s, as the client saw it) and the servers'
    own time p50/p95 of the calls made over HTTP."""
    st = call_stats([t.get("turns", []) for t in trajs])
    return {"pool_calls": st["calls"], "pool_failed": st["failed"], "pool_failure_rate": st["failure_rate"],
            "pool_errors": st["errors"], "pool_cut": st["cut"], "pool_usage_capped": st["usage_capped"],
            "pool_latency_p50_s": st["latency_p50_s"],
            "pool_latency_p95_s": st["latency_p95_s"], "pool_server_p50_s": st["server_p50_s"],
            "pool_server_p95_s": st["server_p95_s"]}


def metrics(trajs: list[dict], model_names: list[str], seed: int = 0) -> dict:
    """Means over one group of trajectories, EM with its 95% bootstrap CI, pool health, pool-model shares,
    and the routing-collapse diagnostic: each model's share of the calls and their entropy in bits."""
    em_lo, em_hi = bootstrap_ci([t["em"] for t in trajs], seed=seed)
    cost, billed = _mean(trajs, "cost_usd"), _mean_given(trajs, "billed_usd")
    call_share, entropy = shares_entropy(call_counts([t.get("turns", []) for t in trajs], model_names))
    return {
        **pool_health(trajs),
        "n": len(trajs),
        "em": _mean(trajs, "em"),
        "em_ci95": [em_lo, em_hi],
        "f1": _mean(trajs, "f1"),
        "format_ok": _mean(trajs, "format_ok"),
        "cost_usd": cost,
        "cost_1e6_usd": cost * 1e6,
        "billed_usd": billed,  # what the APIs would bill (prompt tokens too); cost_usd is the reference's
        "billed_1e6_usd": billed * 1e6,
        "router_tokens": _mean_given(trajs, "policy_tokens"),  # generated by the router itself, not priced
        "pool_prompt_tokens": float(np.mean([_call_tokens(t, "prompt_tokens") for t in trajs])) if trajs else math.nan,
        "pool_completion_tokens": (float(np.mean([_call_tokens(t, "completion_tokens") for t in trajs]))
                                   if trajs else math.nan),
        "cost_reward": _mean(trajs, "cost_reward"),
        "reward": _mean(trajs, "reward"),
        "calls": _mean(trajs, "route_count"),
        "pool_failures": _mean(trajs, "pool_failures"),
        "hit_budget": _mean(trajs, "hit_budget"),
        "forced": float(np.mean([float(t.get("forced", False)) for t in trajs])) if trajs else math.nan,
        "truncated": float(np.mean([float(t.get("truncated", False)) for t in trajs])) if trajs else math.nan,
        # share of questions that called the model at least once
        "model_share": {m: float(np.mean([m in t["models_called"] for t in trajs])) if trajs else math.nan
                        for m in model_names},
        "call_share": call_share,
        "routing_entropy_bits": entropy,  # log2(#models) when calls spread evenly, 0 when one model takes all
        # per domain of a one-fact sub-question (sim world): the calls and each model's share of them
        "domain_call_share": domain_shares([t.get("turns", []) for t in trajs], model_names),
        "stages": stage_rates([t.get("stages") or {} for t in trajs]),  # where EM is lost (router_r1/stages.py)
    }


def summarize(trajs: list[dict], model_names: list[str], seed: int = 0) -> dict:
    """{"sources": {source: metrics}, "overall": metrics + em_macro (mean of the per-source EMs)}."""
    sources = sorted({t["data_source"] for t in trajs})
    per = {s: metrics([t for t in trajs if t["data_source"] == s], model_names, seed) for s in sources}
    overall = metrics(trajs, model_names, seed)
    overall["em_macro"] = float(np.mean([m["em"] for m in per.values()])) if per else math.nan
    return {"sources": per, OVERALL: overall}


def paired_vs(reference: list[dict], records: list[dict], reference_label: str, seed: int = 0) -> dict | None:
    """This run minus the reference run on the questions both answered (matched by uid): EM and cost (1e-6 USD)
    differences with paired bootstrap CIs (one resampling of questions for both), and a verdict in words."""
    ref = {r["uid"]: r for r in reference}
    pairs = [(r, ref[r["uid"]]) for r in records if r["uid"] in ref]
    if not pairs:
        return None
    em_d = [float(a["em"]) - float(b["em"]) for a, b in pairs]
    cost_d = [(float(a["cost_usd"]) - float(b["cost_usd"])) * 1e6 for a, b in pairs]
    em_ci, cost_ci = bootstrap_ci(em_d, seed=seed), bootstrap_ci(cost_d, seed=seed)  # same seed, same n: same draws
    return {"reference": reference_label, "n": len(pairs), "em_diff": float(np.mean(em_d)), "em_diff_ci95": list(em_ci),
            "cost_diff_1e6": float(np.mean(cost_d)), "cost_diff_1e6_ci95": list(cost_ci),
            "verdict": verdict(em_ci, cost_ci)}


def verdict(em_ci: tuple[float, float], cost_ci: tuple[float, float]) -> str:
    """A run against the router, from the CIs of its differences: dominates (higher EM and cheaper, both beyond
    the CI), is dominated (lower and dearer), or which way each differs."""
    if em_ci[0] > 0 and cost_ci[1] < 0:
        return "dominates the router"
    if em_ci[1] < 0 and cost_ci[0] > 0:
        return "dominated by the router"
    em = "higher EM" if em_ci[0] > 0 else "lower EM" if em_ci[1] < 0 else "EM within noise"
    cost = "cheaper" if cost_ci[1] < 0 else "dearer" if cost_ci[0] > 0 else "cost within noise"
    return f"{em}, {cost}"


# ---------------------------------------------------------------------------------- console

def _short(name: str) -> str:
    return name.replace("-Instruct", "")


def format_table(runs: list[dict]) -> str:
    """Plain-text tables: metrics per run and source; each run against the router (paired); where EM is lost
    (stages); each pool model's share of questions. Names are never cut: the columns fit the longest."""
    lw = max([len("run"), *(len(_label(r)) for r in runs)])
    sw = max([len("source"), len(OVERALL), *(len(s) for r in runs for s in r["sources"])])
    head = (f"{'run':<{lw}} {'source':<{sw}} {'n':>5} {'EM':>6} {'95% CI':>15} {'F1':>6} {'fmt':>5} "
            f"{'cost 1e-6$':>11} {'cost $':>10} {'billed 1e-6$':>12} {'R_cost':>6} {'reward':>6} {'calls':>5} "
            f"{'router tok':>10} "
            f"{'failed':>6} {'call p50':>8} {'call p95':>8} {'srv p50':>7}")
    lines = [head, "-" * len(head)]
    for run in runs:
        for source, m in _named_groups(run):
            lo, hi = m["em_ci95"]
            lines.append(f"{_label(run):<{lw}} {source:<{sw}} {m['n']:>5} {m['em']:>6.3f} "
                         f"{f'[{lo:.3f}, {hi:.3f}]':>15} {m['f1']:>6.3f} {m['format_ok']:>5.2f} "
                         f"{m['cost_1e6_usd']:>11.2f} {m['cost_usd']:>10.2e} {_num(m.get('billed_1e6_usd')):>12} "
                         f"{m['cost_reward']:>6.3f} {m['reward']:>6.3f} {m['calls']:>5.2f} "
                         f"{_num(m.get('router_tokens'), '.1f'):>10} {_rate(m):>6} "
                         f"{_secs(m.get('pool_latency_p50_s')):>8} {_secs(m.get('pool_latency_p95_s')):>8} "
                         f"{_secs(m.get('pool_server_p50_s')):>7}")
    lines += _paired_table(runs, lw)
    lines += _stage_table(runs, lw, sw)
    lines += _share_table(runs, lw, sw)
    return "\n".join(lines)


def _paired_table(runs: list[dict], lw: int) -> list[str]:
    compared = [r for r in runs if r.get("vs_router")]
    if not compared:
        return []
    ref = compared[0]["vs_router"]["reference"]
    lw = max(lw, len("against " + ref))
    head = f"{'against ' + ref:<{lw}} {'n':>5} {'EM - router [95% CI]':>28} {'cost - router 1e-6$ [95% CI]':>32}  verdict"
    lines = ["", f"Paired against the router {ref} on the same questions (bootstrap over questions; a CI that "
             "excludes 0 is a difference beyond noise):", head, "-" * len(head)]
    for run in compared:
        v = run["vs_router"]
        (el, eh), (cl, ch) = v["em_diff_ci95"], v["cost_diff_1e6_ci95"]
        lines.append(f"{_label(run):<{lw}} {v['n']:>5} {v['em_diff']:>+8.3f} {f'[{el:+.3f}, {eh:+.3f}]':>19} "
                     f"{v['cost_diff_1e6']:>+10.2f} {f'[{cl:+.2f}, {ch:+.2f}]':>21}  {v['verdict']}")
    return lines


STAGE_HEADS = {"format_ok": "format", "copy_ok": "copy", "expert_ok": "expert ok", "expert_best": "cheapest",
               "gold_in_info": "gold in info", "em_given_gold": "EM|gold", "decomposed": "2-hop split"}


def format_stage_table(runs: list[dict]) -> str:
    """The stages table alone (runs: label, sources and overall, each with n and stages)."""
    lw = max([len("where EM is lost"), *(len(_label(r)) for r in runs)])
    sw = max([len("source"), len(OVERALL), *(len(s) for r in runs for s in r["sources"])])
    return "\n".join(_stage_table(runs, lw, sw)).lstrip("\n")


def _stage_table(runs: list[dict], lw: int, sw: int) -> list[str]:
    if not any(run[OVERALL].get("stages") for run in runs):
        return []
    head = (f"{'where EM is lost':<{lw}} {'source':<{sw}} {'n':>5}"
            + "".join(f" {h:>12}" for h in STAGE_HEADS.values()))
    lines = ["", "Stages (router_r1/stages.py), each over the questions it applies to: format = format ok; copy = "
             "the first sub-question keeps the question's entities; expert ok / cheapest = every readable call "
             "went to an expert that knows it / to the cheapest such (sim world); gold in info = a gold answer "
             "was in an <information> received; EM|gold = EM among those (1 - EM|gold were lost after the pool "
             "gave the answer); 2-hop split = two-fact questions asked in two different calls; - = applies to "
             "none.", head, "-" * len(head)]
    for run in runs:
        for source, m in _named_groups(run):
            st = m.get("stages") or {}
            lines.append(f"{_label(run):<{lw}} {source:<{sw}} {m['n']:>5}"
                         + "".join(f" {_frac(st.get(k)):>12}" for k in STAGE_HEADS))
    return lines


def _share_table(runs: list[dict], lw: int, sw: int) -> list[str]:
    models: list[str] = []
    for run in runs:  # only models some run called: a 6-model pool x many runs is wide enough
        models += [n for n, share in run[OVERALL]["model_share"].items() if share > 0 and n not in models]
    if not models:
        return []
    widths = [max(6, len(_short(n))) for n in models]
    head = (f"{'share of questions':<{lw}} {'source':<{sw}}"
            + "".join(f" {_short(n):>{w}}" for n, w in zip(models, widths)) + f" {'H calls':>8}")
    lines = ["", "Model shares: each model column is the share of the questions in which the run called that model "
             "at least once (a question may call several, so a row can sum above 1); H calls is the entropy in "
             "bits of how the calls spread over the models (0: one model takes every call; log2 of the number of "
             "models: an even spread; - : no calls).", head, "-" * len(head)]
    for run in runs:
        for source, m in _named_groups(run):
            h = m.get("routing_entropy_bits")
            h = math.nan if h is None else h  # a summary.json read back holds null for nan
            lines.append(f"{_label(run):<{lw}} {source:<{sw}}"
                         + "".join(f" {m['model_share'].get(n, 0.0):>{w}.2f}" for n, w in zip(models, widths))
                         + (f" {h:>8.2f}" if h == h else f" {'-':>8}"))
    return lines


def _frac(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _rate(m: dict) -> str:
    """Share of pool calls that failed; '-' when the group made none (or the summary predates it)."""
    return f"{m['pool_failure_rate']:.2f}" if m.get("pool_calls") else "-"


def _num(x, fmt: str = ".2f") -> str:
    """`x` as `fmt`; '-' where it is missing (a run without a policy, a summary older than the column)."""
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def _secs(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"


def _label(run: dict) -> str:
    return run["label"].replace("-Instruct", "")


def _named_groups(run: dict) -> list[tuple[str, dict]]:
    return [*run["sources"].items(), (OVERALL, run[OVERALL])]


# ---------------------------------------------------------------------------------- files

def _clean(x):
    """JSON has no NaN: write null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(path: str | Path, doc: dict) -> None:
    Path(path).write_text(json.dumps(_clean(doc), indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, records: list[dict], append: bool = False) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(_clean(r), ensure_ascii=False) + "\n")


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, em) points no other point beats (cheaper-or-equal and at least as accurate), by cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def png_path(out: str | Path) -> Path:
    """Where a plot asked for as `out` is written: a directory gets pareto.png, a name without suffix .png
    (what matplotlib's savefig would do silently)."""
    out = Path(out)
    if out.is_dir():
        return out / "pareto.png"
    return out if out.suffix else out.with_suffix(".png")


def cost_ticks(costs: list[float]) -> list[float]:
    """Tick positions for the log cost axis: 1-2-5 steps (decades when the costs span over two decades,
    1-1.5-2-3-5-7 under one unless a free method shares the axis) that cover the paid costs, and 0 when a
    method is free; always at least three paid ones, never only a decade label."""
    paid = [c for c in costs if c > 0]
    ticks = [0.0] if any(c <= 0 for c in costs) or not paid else []
    if not paid:
        return ticks + [1.0]
    lo, hi = min(paid), max(paid)
    steps = (1,) if hi >= 100 * lo else (1, 2, 5) if hi >= 10 * lo or ticks else (1, 1.5, 2, 3, 5, 7)
    cands = [float(f"{m * 10.0 ** k:.6g}") for k in range(math.floor(math.log10(lo)) - 1,
                                                          math.ceil(math.log10(hi)) + 2) for m in steps]
    inside = [c for c in cands if lo / 1.5 <= c <= hi * 1.5]
    # the nearest candidates outside the data, when the data alone gives fewer than three
    while len(inside) < 3:
        below = [c for c in cands if c < (inside[0] if inside else lo)]
        above = [c for c in cands if c > (inside[-1] if inside else hi)]
        if not below and not above:
            break
        inside = ([below[-1]] if below else []) + inside + ([above[0]] if above else [])
    return ticks + inside


def _readable_cost_axis(ax, costs: list[float]) -> None:
    """symlog puts a free method (cost 0) next to paid ones but labels only decades (often one label in
    view): place the cost_ticks instead, written as plain numbers, and keep them in view."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = cost_ticks(costs)
    paid_ticks = [t for t in ticks if t > 0]
    # symlog: a free method (cost 0) sits on the axis next to paid ones; linear up to the first paid tick,
    # so the paid ones get the room of a log axis (at linthresh 1 costs of 10-100 were squeezed together)
    ax.set_xscale("symlog", linthresh=min(paid_ticks + [c for c in costs if c > 0]) if paid_ticks else 1.0)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    paid = [t for t in ticks if t > 0] + [c for c in costs if c > 0]
    if paid:
        ax.set_xlim(0.0 if ticks[0] == 0 else min(paid) / 1.3, max(paid) * 1.3)


def plot_pareto(runs: list[dict], path: str | Path) -> Path:
    """EM against mean raw cost (1e-6 USD), one panel per data source and one overall, one point per run;
    returns the PNG's path (png_path)."""
    fig = pareto_figure(runs)
    path = png_path(path)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def alpha_sweeps(runs: list[dict]) -> dict[str, list[dict]]:
    """The router runs of one alpha-conditioned checkpoint told two or more alphas ("told_alpha"), by checkpoint,
    in order of alpha: plot_pareto draws each as one curve."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        if run.get("kind") == "router" and run.get("told_alpha") is not None:
            groups.setdefault(str(run.get("checkpoint")), []).append(run)
    return {c: sorted(rs, key=lambda r: r["told_alpha"]) for c, rs in groups.items() if len(rs) > 1}


FRONTIER_LABEL = "Pareto frontier (no run is cheaper and more accurate)"


def pareto_figure(runs: list[dict]):
    """The figure plot_pareto writes."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a training node
    import matplotlib.pyplot as plt

    panels = sorted({s for run in runs for s in run["sources"]}) + [OVERALL]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows + 0.4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>ph*"  # colour x marker tells apart up to 100 runs (an alpha sweep and all singles)
    # the trained routers (an SFT and a PPO model often land on one point): each its own marker and, where a panel
    # has several, its own label at its own offset, so one never hides the other
    router_markers, router_size = "*XPd", {"*": 150, "X": 80, "P": 80, "d": 70}
    label_offsets = ((10, 10), (10, -16), (-14, 22), (-14, -28))
    sweeps = alpha_sweeps(runs)
    in_sweep = {id(r) for rs in sweeps.values() for r in rs}
    for ax, panel in zip(axes.flat, panels):
        pts = []
        for k, (checkpoint, rs) in enumerate(sweeps.items()):  # one curve per conditioned router, labelled by alpha
            ms = [(r["told_alpha"], r[OVERALL] if panel == OVERALL else r["sources"].get(panel)) for r in rs]
            ms = [(a, m) for a, m in ms if m is not None and m["n"]]
            if not ms:
                continue
            pts += [(m["cost_1e6_usd"], m["em"]) for _, m in ms]
            name = _label(rs[0]).rsplit(" told a=", 1)[0] + " told each alpha"
            ax.plot([m["cost_1e6_usd"] for _, m in ms], [m["em"] for _, m in ms], "-*", ms=10, lw=1.2, zorder=5,
                    color="black" if len(sweeps) == 1 else colors[-1 - k % len(colors)], label=name)
            for a, m in ms:
                ax.annotate(f"{a:g}", (m["cost_1e6_usd"], m["em"]), textcoords="offset points", xytext=(3, 4), fontsize=7)
        routers = []
        for k, run in enumerate(runs):
            m = run[OVERALL] if panel == OVERALL else run["sources"].get(panel)
            if m is None or not m["n"] or id(run) in in_sweep:
                continue
            pts.append((m["cost_1e6_usd"], m["em"]))
            router = run.get("kind") == "router"  # the trained routers stand out from the baselines
            marker = router_markers[len(routers) % len(router_markers)] if router else \
                markers[k // len(colors) % len(markers)]
            ax.scatter([pts[-1][0]], [pts[-1][1]], s=router_size[marker] if router else 32,
                       color=colors[k % len(colors)], marker=marker, label=_label(run), zorder=4 if router else 3,
                       edgecolors="black" if router else "face", linewidths=0.5 if router else 0)
            if router:
                routers.append((run, pts[-1], colors[k % len(colors)]))
        for j, (run, (x, y), color) in enumerate(routers if len(routers) > 1 else []):
            ax.annotate(_label(run), (x, y), textcoords="offset points", xytext=label_offsets[j % len(label_offsets)],
                        fontsize=7, color=color, zorder=6, arrowprops={"arrowstyle": "-", "color": color, "lw": 0.6})
        front = [pts[i] for i in pareto_front(pts)]
        if len(front) > 1:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="grey", lw=1, ls="--",
                    label=FRONTIER_LABEL)
        _readable_cost_axis(ax, [p[0] for p in pts])
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("mean cost per question (1e-6 USD, output tokens)")
        ax.set_ylabel("EM")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    legend = {}  # every panel's entries, each once: the frontier may be drawn in some panels only
    for ax in list(axes.flat)[:len(panels)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    labels = [x for x in legend if x != FRONTIER_LABEL] + ([FRONTIER_LABEL] if FRONTIER_LABEL in legend else [])
    fig.legend([legend[x] for x in labels], labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * math.ceil(len(labels) / 4), 1, 1))
    return fig


def main(argv: list[str] | None = None) -> int:
    """Join the runs of several summary.json files into one table and one Pareto plot (e.g. an alpha sweep)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m router_r1.eval.report", description=main.__doc__)
    p.add_argument("summaries", nargs="+", help="summary.json files written by router_r1.eval.evaluate")
    p.add_argument("--out", default="pareto.png", help="the PNG to write")
    a = p.parse_args(argv)
    runs = []
    for path in a.summaries:
        try:
            runs += json.loads(Path(path).read_text())["runs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {path}: not a summary.json of router_r1.eval.evaluate ({type(e).__name__})",
                  file=sys.stderr)
            return 2
    print(format_table(runs))
    print(f"wrote {plot_pareto(runs, a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
