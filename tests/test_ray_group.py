"""RayWorkerGroup: two Ray actors (gloo FSDP2) give the results of one in-process worker."""
import os

import pytest
import ray
import torch

from test_fsdp_workers import actor_config, dist_batch, flat, make_actor
from verl.single_controller.ray_group import RayWorkerGroup
from verl.workers.actor import ActorWorker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(ppo_epochs=2, entropy_coef=0.01, max_tokens_per_micro_batch=16)


@pytest.fixture(scope="module")
def ray_cluster():
    # Actors import verl and the test helpers by module name, so they need the repo on their path.
    path = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


def test_ray_group_matches_one_process(ray_cluster):
    group = RayWorkerGroup(ActorWorker, world_size=2, init_kwargs={"config": actor_config(**CFG)},
                           ready_timeout_s=120, call_timeout_s=120)
    try:
        group.init_model()
        data = dist_batch()
        log_probs = group.compute_log_prob(data).batch["old_log_probs"]
        metrics = group.call("update_actor", data)
        state = group.get_full_state_dict()
    finally:
        group.shutdown()

    one = make_actor(**CFG)
    torch.testing.assert_close(log_probs, one.compute_log_prob(data).batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    expected = one.update_actor(data)
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
    one_state = one.get_full_state_dict()
    assert state.keys() == one_state.keys()
    torch.testing.assert_close(flat(state), flat(one_state), atol=1e-5, rtol=1e-5)
