"""How fast can this policy learn the routing table when the credit is perfect?

At the point where a hop's model is named, ascend the expected reward of that choice, sum_m pi(m | prefix) Q(d, m),
with Q(d, m) = accuracy of m on domain d x ((1 - alpha) + alpha x c_m) from a simulated pool, c_m = 1 - price_m /
the dearest listed price (a proxy for the run's windowed cost reward). Estimators of that gradient:

- `exact`: every name's Q (no sampling, no critic);
- `sampled`: one drawn name per hop and a 0/1 outcome, the exact expected reward as baseline (REINFORCE with a
  perfect critic); `--samples K` draws K names from one prefix, each against the mean of the other K - 1 (routes
  branched from a shared prefix: GRPO's comparison at the route); `--entropy-coef` adds the names' entropy;
- `critic`: one drawn name and outcome per hop train a critic (the warm start with a head of one value per listed
  name, read at the prefix's end) on Q(prefix, name); the policy ascends sum_m pi(m) Q_critic(prefix, m) over every
  name (mean actor-critic, Allen et al. 2017): exact's update with learned values.

`--ppo-epochs E` (sampled): each batch's draws update the policy E times through PPO's clipped ratio (`--clip`), as
the trainer's epochs do; an update is then one batch, E optimizer steps.

`--explore E` draws each sampled name from (1 - E) pi + E uniform over the listed names (the policy gradient then
weighted by pi / that mixture), so every name keeps being tried whatever the policy has settled on.

P(best) on held-out prompts after each block of updates. What PPO moves at the route with the same optimizer and
step size cannot exceed `exact`; the gap to it is credit and sampling, the rest is the network.

    python -m tools.analysis.route_ascent --checkpoint SFT --data DATA/train.parquet --eval-data DATA/test.parquet \
        --pool configs/pool/sim.yaml [--alpha 0.6] [--lr 1e-4] [--updates 600] [--estimator exact] [--out X.jsonl]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from tools.analysis.route_probs import best_per_domain
from tools.analysis.routing_vs_accuracy import pool_table

PREFIXES = {  # the policy's own words before the name, as the uniform annotator writes them
    "think": "<think>A {domain} fact. Ask ",  # the think names the model first (annotator.think_names_model)
    "search": "<think>A {domain} fact.</think><search>",  # the route is the one place (--no-think-names-model)
}


def q_table(pool: Path, alpha: float) -> tuple[list[str], dict[str, dict[str, float]]]:
    """(listed names, Q[domain][model]): a right answer pays (1 - alpha) + alpha x the name's cost proxy."""
    names, acc, price = pool_table(pool)
    top = max(price.values())
    cost = {m: 1.0 - price[m] / top for m in names}
    return names, {d: {m: acc[d][m] * ((1 - alpha) + alpha * cost[m]) for m in names} for d in acc}


def name_ids(tok, prefix: str, names: list[str]) -> list[int]:
    """The one token each name is after `prefix` (an error if a name takes more than one: score those elsewhere)."""
    seqs = [tok(prefix + n, add_special_tokens=False)["input_ids"] for n in names]
    base = tok(prefix, add_special_tokens=False)["input_ids"]
    ids = []
    for n, s in zip(names, seqs):
        if s[: len(base)] != base or len(s) != len(base) + 1:
            raise SystemExit(f"route_ascent: {n!r} is not one token after {prefix!r} with this tokenizer")
        ids.append(s[-1])
    return ids


def rows(path: Path, tok, style: str, domains: set[str]) -> list[tuple[str, str]]:
    """(prompt text up to the name, first hop's domain) for each row whose first hop has a known domain."""
    import pandas as pd
    out = []
    for row in pd.read_parquet(path).itertuples():
        domain = str(row.extra_info.get("domain") or "").split(">")[0]
        if domain in domains:
            head = tok.apply_chat_template(list(row.prompt), add_generation_prompt=True, tokenize=False)
            out.append((head + PREFIXES[style].format(domain=domain), domain))
    if not out:
        raise SystemExit(f"route_ascent: no row of {path} has a first-hop domain among {sorted(domains)}")
    return out


def name_probs(model, tok, batch: list[tuple[str, str]], ids: list[int]) -> torch.Tensor:
    """pi(name | prefix) over the whole vocabulary, (B, names)."""
    enc = tok([p for p, _ in batch], return_tensors="pt", padding=True, add_special_tokens=False)
    logits = model(**enc).logits  # (B, T, V), left-padded: the last position is each prefix's end
    return logits[:, -1].float().softmax(-1)[:, ids]


def p_best(model, tok, held: list[tuple[str, str]], ids, names, best) -> dict[str, float]:
    """Mean P(best) per domain and overall, normalised over the listed names as route_probs does."""
    per: dict[str, list[float]] = {}
    with torch.no_grad():
        for i in range(0, len(held), 64):
            chunk = held[i:i + 64]
            p = over_names(name_probs(model, tok, chunk, ids))
            for (_, d), row in zip(chunk, p):
                per.setdefault(d, []).append(float(row[names.index(best[d])]))
    out = {d: sum(v) / len(v) for d, v in sorted(per.items())}
    out["all"] = sum(sum(v) for v in per.values()) / sum(len(v) for v in per.values())
    return out


def over_names(p: torch.Tensor) -> torch.Tensor:
    """(B, names): the policy normalised over the listed names, as route_probs reads it."""
    return p / p.sum(-1, keepdim=True)


def behaviour(p: torch.Tensor, explore: float) -> torch.Tensor:
    """(B, names): the policy over the listed names, mixed with a uniform draw at rate `explore`."""
    return (1 - explore) * over_names(p) + explore / p.shape[-1]


class NameCritic(torch.nn.Module):
    """Q(prefix, name) for every listed name at once: the warm start's last hidden state at the prefix's end through
    a linear head of one output per name (a value head with an output per choice; no forward per name)."""

    def __init__(self, checkpoint: Path, n_names: int):
        super().__init__()
        from transformers import AutoModelForCausalLM
        self.body = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).model
        self.head = torch.nn.Linear(self.body.config.hidden_size, n_names)

    def forward(self, tok, batch: list[tuple[str, str]]) -> torch.Tensor:
        """(B, names)."""
        enc = tok([p for p, _ in batch], return_tensors="pt", padding=True, add_special_tokens=False)
        return self.head(self.body(**enc).last_hidden_state[:, -1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="the warm start (HF dir) to ascend from")
    ap.add_argument("--data", type=Path, required=True, help="parquet whose prompts the updates draw from")
    ap.add_argument("--eval-data", type=Path, required=True, help="parquet of held-out prompts P(best) is read on")
    ap.add_argument("--pool", type=Path, required=True,
                    help="simulated pool yaml: the listed names, accuracies, prices")
    ap.add_argument("--style", choices=sorted(PREFIXES), default="think",
                    help="where the name is written: think (the uniform annotator's default) or search")
    ap.add_argument("--alpha", type=float, default=0.6, help="the reward's cost weight in Q")
    ap.add_argument("--estimator", choices=("exact", "sampled", "critic"), default="exact",
                    help="exact: every name's Q; sampled: drawn names, 0/1 outcomes; critic: every name's learned Q")
    ap.add_argument("--samples", type=int, default=1,
                    help="sampled: names drawn per hop; above 1 each is scored against the others' mean outcome")
    ap.add_argument("--entropy-coef", type=float, default=0.0, help="weight of the listed names' entropy in the loss")
    ap.add_argument("--explore", type=float, default=0.0,
                    help="sampled, critic: share of draws made uniformly over the listed names (off-policy)")
    ap.add_argument("--ppo-epochs", type=int, default=0,
                    help="sampled: optimizer steps per batch through PPO's clipped ratio (0: one plain policy-gradient step)")
    ap.add_argument("--clip", type=float, default=0.2, help="with --ppo-epochs: the ratio's clip range (the trainer's)")
    ap.add_argument("--critic-lr", type=float, default=5e-4, help="critic: its Adam step size (the embedded default's)")
    ap.add_argument("--lr", type=float, default=1e-4, help="Adam step size (the embedded default's actor lr)")
    ap.add_argument("--updates", type=int, default=600, help="optimizer updates (300 PPO steps x 2 epochs = 600)")
    ap.add_argument("--batch", type=int, default=48, help="hops per update (32 questions x ~1.5 hops)")
    ap.add_argument("--every", type=int, default=50, help="read P(best) every this many updates")
    ap.add_argument("--seed", type=int, default=0, help="sampling and batch order")
    ap.add_argument("--out", type=Path, default=None, help="JSONL of the P(best) readings")
    args = ap.parse_args(argv)
    if args.ppo_epochs < 0 or (args.ppo_epochs and args.estimator != "sampled"):
        ap.error("--ppo-epochs: a count >= 0, for --estimator sampled only")

    from transformers import AutoModelForCausalLM

    from verl.utils.tokenizer import load_tokenizer

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    names, q = q_table(args.pool, args.alpha)
    best = best_per_domain(args.pool, names)
    tok = load_tokenizer(str(args.checkpoint))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    ids = name_ids(tok, PREFIXES[args.style].format(domain="science"), names)
    train, held = rows(args.data, tok, args.style, set(q)), rows(args.eval_data, tok, args.style, set(q))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    if args.estimator == "critic":
        critic = NameCritic(args.checkpoint, len(names))
        critic_opt = torch.optim.Adam(critic.parameters(), lr=args.critic_lr)
    if args.out:
        args.out.write_text("")

    def read(step: int) -> None:
        model.eval()
        r = {"update": step, **{f"p_best/{k}": v for k, v in p_best(model, tok, held, ids, names, best).items()}}
        model.train()
        if args.out:  # each reading as it comes: a long ascent stopped early keeps what it read
            with args.out.open("a") as f:
                f.write(json.dumps(r) + "\n")
        per = " ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in r.items()
                       if k.startswith("p_best/") and k != "p_best/all")
        print(f"update {step:4d} | P(best) {r['p_best/all']:.3f} | {per}", flush=True)

    read(0)
    for step in range(1, args.updates + 1):
        batch = rng.sample(train, min(args.batch, len(train)))
        qs = torch.tensor([[q[d][m] for m in names] for _, d in batch])  # (B, names)
        p = name_probs(model, tok, batch, ids)  # (B, names)
        if args.estimator == "exact":
            loss = -(p * qs).sum(-1).mean()
        elif args.estimator == "critic":
            q_hat = critic(tok, batch)  # (B, names)
            with torch.no_grad():
                pick = torch.multinomial(behaviour(p, args.explore), 1)  # (B, 1)
                won = torch.bernoulli(qs.gather(1, pick).clamp(0, 1))  # (B, 1)
            critic_opt.zero_grad()
            ((q_hat.gather(1, pick) - won) ** 2).mean().backward()
            critic_opt.step()
            loss = -(p * q_hat.detach()).sum(-1).mean()
        else:
            k = args.samples
            with torch.no_grad():
                mu = behaviour(p, args.explore)  # (B, names)
                pick = torch.multinomial(mu, k, replacement=True)  # (B, K)
                weight = over_names(p).gather(1, pick) / mu.gather(1, pick)  # (B, K): pi / mu
                won = torch.bernoulli(qs.gather(1, pick).clamp(0, 1))  # (B, K): paid 1 w.p. Q (Q <= 1)
                if k == 1:  # a perfect critic: the expected reward under the policy
                    base = (over_names(p) * qs).sum(-1, keepdim=True)
                else:  # leave-one-out: the other draws from the same prefix
                    base = (won.sum(-1, keepdim=True) - won) / (k - 1)
                adv = (won - base) * weight  # (B, K)
            loss = -(adv * p.gather(1, pick).log()).mean()
            if args.ppo_epochs:  # PPO's epochs on this batch: the clipped surrogate of pi / pi_old at the picks
                old = p.gather(1, pick).detach()  # (B, K)
                for epoch in range(args.ppo_epochs):
                    if epoch:
                        p = name_probs(model, tok, batch, ids)
                    ratio = p.gather(1, pick) / old
                    loss = -torch.min(ratio * adv, ratio.clamp(1 - args.clip, 1 + args.clip) * adv).mean()
                    if epoch < args.ppo_epochs - 1:
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
        if args.entropy_coef:
            pn = over_names(p)
            loss = loss + args.entropy_coef * (pn * pn.clamp_min(1e-12).log()).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.every == 0 or step == args.updates:
            read(step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
