"""Pool health over a batch of episodes: per-call failure rate and latency, and the gate that stops
a training run whose pool keeps failing.

A failed call is an observation for the policy, so one bad batch must not end a run; but a
run whose pool fails batch after batch trains on "the pool is down" and logs a good-looking
reward. The gate counts consecutive training batches above `max_failure_rate` and raises
PoolFailureError after `patience` of them, naming the rate, the error kinds and `hint`
(the settings that bound the calls). A run too short for that, or whose pool fails every
other batch, is caught at its end: `check_run` raises when the run's calls as a whole failed
above `max_failure_rate`. The streak and the run's counts are checkpointed (state_dict), so
a run stopped for its pool and resumed with the pool still down stops again at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


class PoolFailureError(RuntimeError):
    """A run's pool calls failed more often than allowed (training: for too long; evaluation: any run of it);
    the message gives the rate, the error kinds and what to check."""


def call_stats(turns: list[list[dict]]) -> dict:
    """Calls, failures by error kind, replies cut, usage claims capped, and time p50/p95 (s, cache hits left out)
    over episodes' turns: `latency` is the call as the client saw it (waiting for a connection slot, every attempt,
    the backoff between), `server` the answering server's own time where it reports one."""
    calls = [t for ep in turns for t in ep if "ok" in t]
    errors: dict[str, int] = {}
    for c in calls:
        if not c["ok"]:
            errors[str(c.get("error"))] = errors.get(str(c.get("error")), 0) + 1
    lat = [float(c["latency_s"]) for c in calls if not c.get("cached") and c.get("latency_s") is not None]
    p50, p95 = np.percentile(lat, [50, 95]).tolist() if lat else (math.nan, math.nan)
    srv = [float(c["server_s"]) for c in calls if not c.get("cached") and c.get("server_s") is not None]
    s50, s95 = np.percentile(srv, [50, 95]).tolist() if srv else (math.nan, math.nan)
    failed = sum(errors.values())
    return {"calls": len(calls), "failed": failed, "failure_rate": failed / len(calls) if calls else 0.0,
            "errors": dict(sorted(errors.items())), "cut": sum(bool(c.get("cut")) for c in calls),
            "usage_capped": sum(bool(c.get("usage_capped")) for c in calls),
            "latency_p50_s": p50, "latency_p95_s": p95, "server_p50_s": s50, "server_p95_s": s95}


@dataclass
class PoolHealth:
    max_failure_rate: float = 0.2  # a training batch whose pool calls fail more often counts as unhealthy
    patience: int = 3  # consecutive unhealthy training batches before the run stops (PoolFailureError)
    hint: str = ""  # appended to the error: the timeouts in force, where to look
    _unhealthy: int = field(default=0, repr=False)
    _calls: int = field(default=0, repr=False)  # the run's training calls so far
    _failed: int = field(default=0, repr=False)
    _errors: dict = field(default_factory=dict, repr=False)  # the run's failed training calls by error kind

    def __post_init__(self):
        if not 0.0 <= self.max_failure_rate <= 1.0 or self.patience < 1:
            raise ValueError(f"PoolHealth: max_failure_rate must be in [0, 1] and patience >= 1, got "
                             f"{self.max_failure_rate}, {self.patience}")

    def observe(self, turns: list[list[dict]], validate: bool) -> dict[str, list[float]]:
        """Metrics of one batch (one value each); a training batch may raise PoolFailureError."""
        s = call_stats(turns)
        metrics = {"pool/failure_rate": [s["failure_rate"]], "pool/calls": [float(s["calls"])],
                   "pool/cut": [float(s["cut"])], "pool/usage_capped": [float(s["usage_capped"])]}
        if s["calls"] and math.isfinite(s["latency_p50_s"]):
            metrics.update({"pool/latency_p50_s": [s["latency_p50_s"]], "pool/latency_p95_s": [s["latency_p95_s"]]})
        if s["calls"] and math.isfinite(s["server_p50_s"]):
            metrics.update({"pool/server_p50_s": [s["server_p50_s"]], "pool/server_p95_s": [s["server_p95_s"]]})
        if validate or not s["calls"]:
            return metrics
        self._calls += s["calls"]
        self._failed += s["failed"]
        for kind, n in s["errors"].items():
            self._errors[kind] = self._errors.get(kind, 0) + n
        metrics["pool/run_failure_rate"] = [self.run_failure_rate]
        self._unhealthy = self._unhealthy + 1 if s["failure_rate"] > self.max_failure_rate else 0
        if self._unhealthy >= self.patience:
            kinds = ", ".join(f"{k} {n}" for k, n in s["errors"].items())
            raise PoolFailureError(
                f"pool calls failed above env.max_pool_failure_rate {self.max_failure_rate:g} for {self._unhealthy} "
                f"training batches in a row (env.pool_failure_patience {self.patience}); the last: {s['failed']} of "
                f"{s['calls']} calls ({s['failure_rate']:.0%}: {kinds}). Training on pool failures teaches the "
                f"policy nothing about routing; stopping." + (f" {self.hint}" if self.hint else ""))
        return metrics

    @property
    def run_failure_rate(self) -> float:
        """Failed over all training calls of the run so far (0 before any)."""
        return self._failed / self._calls if self._calls else 0.0

    def check_run(self) -> None:
        """PoolFailureError when the run's training calls as a whole failed above max_failure_rate."""
        if self._calls and self.run_failure_rate > self.max_failure_rate:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(self._errors.items()))
            raise PoolFailureError(
                f"pool calls failed above env.max_pool_failure_rate {self.max_failure_rate:g} over the whole run: "
                f"{self._failed} of {self._calls} training calls ({self.run_failure_rate:.0%}: {kinds}). This "
                f"run's checkpoints learned from failed calls, not from routing." + (f" {self.hint}" if self.hint else ""))

    def state_dict(self) -> dict:
        return {"unhealthy": self._unhealthy, "calls": self._calls, "failed": self._failed, "errors": dict(self._errors)}

    def load_state_dict(self, state: dict) -> None:
        self._unhealthy = int(state.get("unhealthy", 0))
        self._calls, self._failed = int(state.get("calls", 0)), int(state.get("failed", 0))
        self._errors = {str(k): int(n) for k, n in (state.get("errors") or {}).items()}
