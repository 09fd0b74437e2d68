"""Load-balanced rollout assignment: greedy least-loaded by hand, uniform chunks, load hints."""
from types import SimpleNamespace

import pytest

from verl.trainer.balance import assign_balanced, assign_uniform, engine_loads, imbalance, row_loads


def test_uniform_is_contiguous_near_equal_chunks():
    assert assign_uniform(7, 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert assign_uniform(2, 3) == [[0], [1], []]
    with pytest.raises(ValueError, match="n_engines"):
        assign_uniform(3, 0)


def test_balanced_by_hand():
    # Two prompts of budget 6, four of budget 1, contiguous (as GRPO samples are).
    loads = [6, 6, 1, 1, 1, 1]
    assert engine_loads(loads, assign_uniform(6, 2)) == [13, 3]
    plan = assign_balanced(loads, 2)
    # 6 -> e0, 6 -> e1, then 1s alternate (ties go to the engine with fewer requests, then the lower index)
    assert plan == [[0, 2, 4], [1, 3, 5]]
    assert engine_loads(loads, plan) == [8, 8] and imbalance(engine_loads(loads, plan)) == 1.0
    assert imbalance([13, 3]) == pytest.approx(13 / 8)


def test_balanced_largest_first_to_the_least_loaded():
    loads = [3, 5, 2, 4, 4, 1]
    # 5 (#1) -> e0; 4 (#3) -> e1; 4 (#4) -> e2; 3 (#0) -> e1 (e1, e2 tie at 4: lower index) = 7;
    # 2 (#2) -> e2 = 6; 1 (#5) -> e0 = 6
    assert assign_balanced(loads, 3) == [[1, 5], [0, 3], [2, 4]]


def test_balanced_is_a_partition_and_deterministic():
    loads = [(i * 7919) % 13 for i in range(50)]
    plan = assign_balanced(loads, 4)
    assert sorted(i for b in plan for i in b) == list(range(50))
    assert all(b == sorted(b) for b in plan)
    assert assign_balanced(list(loads), 4) == plan
    uniform = engine_loads(loads, assign_uniform(50, 4))
    assert max(engine_loads(loads, plan)) <= max(uniform)


def test_zero_loads_spread_by_count_and_bad_loads_named():
    assert assign_balanced([0, 0, 0, 0], 2) == [[0, 2], [1, 3]]
    assert assign_balanced([1.0], 3) == [[0], [], []]
    with pytest.raises(ValueError, match="request 1"):
        assign_balanced([1, -2], 2)
    with pytest.raises(ValueError, match="request 0"):
        assign_balanced([float("nan")], 2)


def row(budget=None):
    extra = {"uid": "x"} if budget is None else {"uid": "x", "turn_budget": budget}
    return SimpleNamespace(fields={"extra_info": extra})


def test_row_loads_from_turn_budget_or_the_environment():
    assert row_loads([row(3), row(1)]) == [3.0, 1.0]
    assert row_loads([row(3), row()]) is None  # one row without a hint: no balancing
    assert row_loads([SimpleNamespace(fields={})]) is None
    env = SimpleNamespace(row_load=lambda r, sampling, validate: (1 if validate else 10) * r.fields["extra_info"][
        "turn_budget"])
    assert row_loads([row(3), row(1)], env) == [30.0, 10.0]
    assert row_loads([row(3), row(1)], env, None, validate=True) == [3.0, 1.0]
