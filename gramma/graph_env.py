"""GraphEnv: the GraMMA knowledge-graph environment behind the engine's Env interface.

Per sample: the episode opens with the start's neighbourhood as an observation; then
generate one turn (stops at </action>), apply it to the Session, append the
observation as environment tokens (response_mask 0), repeat until STOP, the turn budget,
or the response budget. When `max_context_tokens` is set and a context outgrows it, the
model sees prompt + memory summary + the newest turns (memory.compress); the trajectory
that is trained stays the full one, so keep the budget above what training episodes reach
(compression is for long-horizon inference; it shifts the sampling context otherwise).

Score: format gate (every turn well formed and the episode ended with STOP), else
`format_penalty`; then answer correctness (EM or F1 against the gold names), optionally
scaled by the evidence check: r = correct * (1 - w + w * evidence_ok).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
from omegaconf import MISSING

from gramma.actions import STOP_STRING
from gramma.graph import KnowledgeGraph
from gramma.memory import compress
from gramma.ranking import Ranker, RankConfig
from gramma.session import OBS_CLOSE, OBS_OPEN, Session, neutralise
from router_r1.reward.qa_em import em_score, f1_score
from verl.trainer.config import section_to_dataclass
from verl.trainer.env_interface import GenerateFn, RolloutResult
from verl.workers.rollout.base import SamplingParams


@dataclass
class GraphEnvConfig:
    """`env` of a GraMMA run (configs/env/gramma.yaml)."""

    graph_dir: str = MISSING  # the graph directory (entities + triples files, data_process.kg_synth)
    max_turns: int = 6  # generations; the last must STOP (kg_oracle --max-turns)
    response_length: int = 64  # tokens per generated turn
    max_response_length: int = 1024  # all turns and observations together
    max_obs_tokens: int = 256  # tokens inside one <information> block
    max_context_tokens: Optional[int] = None  # compress the model's context above this many tokens (null: never)
    summary_tokens: int = 96  # cap on the memory summary inside a compressed context
    answer_metric: str = "em"  # em | f1
    format_penalty: float = -1.0  # score of a broken trajectory
    evidence_weight: float = 0.0  # > 0: scale a right answer by the evidence check (0 = no check)
    invalid_hint: bool = True  # a corrective hint after an invalid action
    rank: RankConfig = field(default_factory=RankConfig)  # ranking weights of a neighbourhood (gramma/ranking.py)
    factory: str = "gramma.graph_env:make_env"  # "module:function" the engine calls with (env section, tokenizer)


@dataclass
class Trajectory:
    session: Session
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 = policy token, 0 = environment token
    turns: list[list[int]] = field(default_factory=list)  # the same ids, one list per segment
    text: str = ""
    truncated: bool = False
    compressed: int = 0  # generations whose context was compressed

    @property
    def done(self) -> bool:
        return self.session.done or self.truncated

    def add(self, ids: list[int], text: str, by_policy: bool) -> None:
        self.response_ids += ids
        self.response_mask += [int(by_policy)] * len(ids)
        self.turns.append(list(ids))
        self.text += text


class GraphEnv:
    def __init__(self, cfg: GraphEnvConfig, tokenizer, graph: KnowledgeGraph | None = None, embedder=None):
        if cfg.answer_metric not in ("em", "f1"):
            raise ValueError(f"env.answer_metric must be em|f1, got {cfg.answer_metric!r}")
        self.cfg, self.tok = cfg, tokenizer
        self.graph = graph if graph is not None else KnowledgeGraph.load(cfg.graph_dir)
        self.ranker = Ranker(self.graph, cfg.rank, embedder)

    # ------------------------------------------------------------------ episodes
    def new_session(self, fields: dict, where: str = "row") -> Session:
        info = fields.get("extra_info") or {}
        if not info.get("start") or not info.get("question"):
            raise ValueError(f"{where}: extra_info needs 'start' (entity id) and 'question'")
        return Session(self.graph, self.ranker, info["question"], info["start"], self.cfg.max_turns,
                       self.cfg.invalid_hint)

    def rollout(self, rows, generate: GenerateFn, sampling: SamplingParams, validate: bool) -> RolloutResult:
        trajs = [Trajectory(self.new_session(r.fields, f"row {i} ({r.uid})"), list(r.prompt_ids))
                 for i, r in enumerate(rows)]
        for t in trajs:  # the episode opens on the start's neighbourhood
            if not self.append_observation(t, t.session.begin()):
                raise ValueError(f"env.max_response_length={self.cfg.max_response_length} leaves no room to act "
                                 "after the first observation")
        sampling = replace(sampling, stop=(STOP_STRING,), max_new_tokens=self.cfg.response_length)
        while live := [t for t in trajs if not t.done]:
            outs = generate([self.context(t) for t in live], sampling)
            for t, out in zip(live, outs):
                self.after_generation(t, out.token_ids)
        return self._result(trajs)

    def after_generation(self, t: Trajectory, out_ids: list[int]) -> None:
        """Append the policy's turn, step the session, append its observation."""
        out_ids = out_ids[: max(0, self.room(t))]
        text = self.tok.decode(out_ids, skip_special_tokens=True)
        t.add(out_ids, text, by_policy=True)
        obs = t.session.step(text)
        if t.session.done:
            return
        if not self.append_observation(t, obs):
            t.truncated = True

    def append_observation(self, t: Trajectory, obs: str) -> bool:
        """Append an <information> block as environment tokens; False if no room would be left to act."""
        ids = self.tok(self.fit(obs, self.cfg.max_obs_tokens), add_special_tokens=False)["input_ids"]
        if len(ids) >= self.room(t):
            return False
        t.add(ids, self.tok.decode(ids, skip_special_tokens=True), by_policy=False)
        return True

    def room(self, t: Trajectory) -> int:
        return self.cfg.max_response_length - len(t.response_ids)

    def fit(self, block: str, max_tokens: int) -> str:
        """Cut the inside of an <information> block to max_tokens, keeping both tags."""
        body = block[len(OBS_OPEN):-len(OBS_CLOSE)]
        ids = self.tok(body, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return block
        return OBS_OPEN + self.tok.decode(ids[:max_tokens], skip_special_tokens=True) + " ..." + OBS_CLOSE

    def summary_ids(self, t: Trajectory) -> list[int]:
        text = OBS_OPEN + "Memory: " + neutralise(t.session.memory.summary(self.graph)) + OBS_CLOSE
        return self.tok(self.fit(text, self.cfg.summary_tokens), add_special_tokens=False)["input_ids"]

    def context(self, t: Trajectory) -> list[int]:
        """What the policy sees next: the whole trajectory, or its compressed form over budget."""
        full = t.prompt_ids + t.response_ids
        budget = self.cfg.max_context_tokens
        if budget is None or len(full) + self.cfg.response_length <= budget:
            return full
        t.compressed += 1
        ids, _ = compress(t.prompt_ids, self.summary_ids(t), t.turns, budget - self.cfg.response_length)
        return ids

    def _result(self, trajs: list[Trajectory]) -> RolloutResult:
        s = [t.session for t in trajs]
        return RolloutResult(
            prompt_ids=[t.prompt_ids for t in trajs],
            response_ids=[t.response_ids for t in trajs],
            response_mask=[t.response_mask for t in trajs],
            info={"text": [t.text for t in trajs], "answer": [x.answer for x in s],
                  "evidence": [list(x.evidence) for x in s], "cross_checked": [list(x.cross_checked) for x in s],
                  "visited": [list(x.memory.visited) for x in s], "turn_log": [list(x.log) for x in s],
                  "well_formed": [x.well_formed for x in s], "stopped": [x.answer is not None for x in s],
                  "hit_budget": [x.hit_budget for x in s], "truncated": [t.truncated for t in trajs],
                  "compressed": [t.compressed for t in trajs]},
        )

    # ------------------------------------------------------------------ reward
    def score(self, result: RolloutResult, rows, validate: bool):
        info, scores = result.info, []
        m: dict[str, list[float]] = {k: [] for k in ("em", "f1", "format_ok", "evidence_ok", "turns",
                                                      "invalid_actions", "expands", "cross_modal", "hit_budget",
                                                      "truncated", "compressed", "gold_visited")}
        for i, row in enumerate(rows):
            gt = (row.fields.get("reward_model") or {}).get("ground_truth") or {}
            golds = gt.get("target")
            if not golds:
                raise ValueError(f"row {i} ({row.uid}): missing reward_model.ground_truth.target")
            answer, log = info["answer"][i], info["turn_log"][i]
            fmt = bool(info["well_formed"][i] and info["stopped"][i])
            em, f1 = em_score(answer, golds), f1_score(answer, golds)
            ev = self.evidence_ok(row.fields, answer, info["evidence"][i], info["cross_checked"][i])
            correct = em if self.cfg.answer_metric == "em" else f1
            w = self.cfg.evidence_weight
            scores.append(correct * (1 - w + w * ev) if fmt else self.cfg.format_penalty)
            gold_path = list(gt.get("path") or [])
            visited = set(info["visited"][i])
            for k, v in (("em", em), ("f1", f1), ("format_ok", fmt), ("evidence_ok", ev), ("turns", len(log)),
                         ("invalid_actions", sum(t["kind"] == "invalid" for t in log)),
                         ("expands", sum(t["kind"] == "expand" for t in log)),
                         ("cross_modal", sum(t["kind"] == "cross_modal" for t in log)),
                         ("hit_budget", info["hit_budget"][i]), ("truncated", info["truncated"][i]),
                         ("compressed", info["compressed"][i] > 0),
                         ("gold_visited", sum(p in visited for p in gold_path[:-1]) / max(1, len(gold_path) - 1))):
                m[k].append(float(v))
        return np.asarray(scores, dtype=np.float32), m

    def evidence_ok(self, fields: dict, answer, evidence: list[str], cross_checked: list[str]) -> bool:
        """Check the STOP evidence against the graph (see Session.evidence_ok)."""
        info = fields.get("extra_info") or {}
        visual = ((fields.get("reward_model") or {}).get("ground_truth") or {}).get("visual") or ""
        s = Session(self.graph, self.ranker, info.get("question", ""), info["start"])
        s.answer, s.evidence, s.cross_checked = answer, list(evidence), list(cross_checked)
        return s.evidence_ok(visual)

    def state_dict(self) -> dict:
        return {}  # the reward has no state

    def load_state_dict(self, state: dict) -> None:
        pass


def make_env(env_cfg, tokenizer) -> GraphEnv:
    """Factory for `env.factory: gramma.graph_env:make_env` (keys: GraphEnvConfig)."""
    cfg = section_to_dataclass(GraphEnvConfig, env_cfg, "env")
    if not cfg.graph_dir:
        raise ValueError("env.graph_dir must name a graph directory (entities + triples files)")
    return GraphEnv(cfg, tokenizer)


make_env.config_class = GraphEnvConfig
