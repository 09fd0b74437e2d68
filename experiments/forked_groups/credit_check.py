"""Does the sibling credit point the right way? Forked groups from a checkpoint at its first turn, against the
simulated pool: the mean group-relative advantage of episodes whose first route asked the hop's best model, and of
the rest.

    python -m experiments.forked_groups.credit_check --checkpoint SFT/sft --data SFT/data/train.parquet \
        --run-config RUN/ppo/run_config.yaml [--prompts 96] [--n 4]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="the policy (HF dir) whose forks are played")
    ap.add_argument("--data", type=Path, required=True, help="parquet of the prompts (extra_info.domain: the hops')")
    ap.add_argument("--run-config", type=Path, required=True, help="a training run's run_config.yaml: its env section")
    ap.add_argument("--pool", default="configs/pool/sim.yaml", help="the simulated pool yaml (served here)")
    ap.add_argument("--prompts", type=int, default=96, help="groups played (the data's first rows)")
    ap.add_argument("--n", type=int, default=4, help="episodes a group")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (the runs')")
    ap.add_argument("--seed", type=int, default=5, help="sampling seed")
    args = ap.parse_args(argv)

    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from router_r1.pool.server import ServerThread
    from router_r1.router_env import make_env
    from sim.backend import SimBackend
    from tools.analysis.route_probs import best_per_domain
    from verl.algos.advantages import compute_grpo_advantages
    from verl.trainer.dataset import PromptDataset
    from verl.utils.tokenizer import load_tokenizer
    from verl.workers.rollout.base import SamplingParams
    from verl.workers.rollout.hf_rollout import HFRollout

    tok = load_tokenizer(str(args.checkpoint))
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    engine = HFRollout(model, tok, eos_token_ids=[tok.eos_token_id])
    rows = [r for r in PromptDataset(str(args.data), tok).rows[: args.prompts] for _ in range(args.n)]
    env_cfg = OmegaConf.to_container(OmegaConf.load(args.run_config), resolve=True)["env"]  # the run's lengths
    with ServerThread(SimBackend.from_pool_yaml(args.pool, seed=0, latency_scale=0.0)) as srv:
        env_cfg.update(pool=args.pool, pool_url=srv.url, branch_turns=[0], prompt_template=None)
        env = make_env(env_cfg, tok)
        sampling = SamplingParams(temperature=args.temperature, max_new_tokens=64, seed=args.seed)
        result = env.rollout(rows, engine, sampling, validate=False)
        scores, _ = env.score(result, rows, validate=False)
        env.client.close()

    best = best_per_domain(args.pool, env.registry.names)
    # the trainer's sibling advantage: score - group mean, over the group's std (one token an episode here)
    adv, _ = compute_grpo_advantages(torch.as_tensor(scores), [r.uid for r in rows], torch.ones(len(rows), 1))
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[r.uid].append(i)
    on_best, other, informative = [], [], 0
    for idx in groups.values():
        if len({float(scores[i]) for i in idx}) == 1:
            continue
        informative += 1
        domain = rows[idx[0]].fields["extra_info"]["domain"].split(">")[0]
        for i in idx:
            asked = result.info["turns"][i][0].get("model")
            (on_best if asked == best[domain] else other).append(float(adv[i, 0]))
    print(f"{informative} of {len(groups)} groups have differing rewards")
    for label, xs in (("asked the hop's best model", on_best), ("asked another", other)):
        mean = f"{statistics.mean(xs):+.2f}" if xs else "-"
        print(f"{label}: {len(xs)} episodes, mean sibling advantage {mean}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
