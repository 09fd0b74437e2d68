"""Ray: colocated worker groups on a two-node cluster simulated on this machine (two raylets on
loopback, one CPU each), resource checks, a dying rank named, and the PPO trainer end to end."""
import os
import time

import pytest
import ray
import torch
from ray.cluster_utils import Cluster

from test_fsdp_workers import actor_config, dist_batch, flat, make_actor
from test_trainer import by_step, config
from verl.single_controller.base import Worker, register
from verl.single_controller.ray_group import RayPlacement, RayWorkerGroup, ResourceError, WorkerError
from verl.trainer.main_ppo import run
from verl.workers.actor import ActorWorker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(ppo_epochs=2, entropy_coef=0.01, max_tokens_per_micro_batch=16)


@pytest.fixture(scope="module")
def two_nodes():
    """A head node and a second node, each with one CPU, as separate raylets on loopback."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    # Actors import verl and the test helpers by module name, so they need the repo on their path.
    path = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}})
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_ray_group_on_two_nodes_matches_one_process(two_nodes):
    group = RayWorkerGroup({"actor": (ActorWorker, {"config": actor_config(**CFG)})},
                           RayPlacement(world_size=2, ready_timeout_s=120, call_timeout_s=120))
    try:
        assert len(set(group.nodes)) == 2  # one CPU per node: PACK has to use both
        actor = group.role("actor")
        actor.init_model()
        data = dist_batch()
        log_probs = actor.compute_log_prob(data).batch["old_log_probs"]
        metrics = actor.call("update_actor", data)
        state = actor.get_full_state_dict()
    finally:
        group.shutdown()

    one = make_actor(**CFG)
    torch.testing.assert_close(log_probs, one.compute_log_prob(data).batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    expected = one.update_actor(data)
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
    torch.testing.assert_close(flat(state), flat(one.get_full_state_dict()), atol=1e-5, rtol=1e-5)


def test_a_request_the_cluster_cannot_hold_fails_at_once_with_both_numbers(two_nodes):
    # the numbers come from a check before placement; the reference waited 5.5 min for a placement timeout
    with pytest.raises(ResourceError, match=r"2 workers x 4 CPU = 8 CPU.*has 2 CPU"):
        RayWorkerGroup({"actor": (ActorWorker, {})}, RayPlacement(world_size=2, num_cpus_per_worker=4))
    with pytest.raises(ResourceError, match=r"2 workers x 1 GPU = 2 GPU.*has 0 GPU"):
        RayWorkerGroup({"actor": (ActorWorker, {})}, RayPlacement(world_size=2, num_gpus_per_worker=1))
    with pytest.raises(ResourceError, match="nnodes=3.*2 alive"):
        RayWorkerGroup({"actor": (ActorWorker, {})}, RayPlacement(world_size=2, nnodes=3))


class FragileWorker(Worker):
    """Rank `victim` exits mid-call while the other rank blocks, as it would inside a collective."""

    def __init__(self):
        super().__init__(device="cpu")

    @register("all")
    def step(self, victim: int, done_file: str) -> int:
        if self.rank == victim:
            os._exit(1)
        time.sleep(120)
        open(done_file, "w").close()
        return self.rank


def test_a_rank_that_dies_mid_step_is_named_not_waited_for(two_nodes, tmp_path):
    group = RayWorkerGroup({"critic": (FragileWorker, {})}, RayPlacement(world_size=2, ready_timeout_s=120))
    done = tmp_path / "survivor_done"
    try:
        with pytest.raises(WorkerError, match=r"critic\.step: role 'critic' rank 1 on node [\d.]+/\w+ died"):
            group.role("critic").step(1, str(done))
        assert not done.exists()  # the surviving rank still sleeps: the error did not wait for it
    finally:
        group.shutdown()


class BrokenWorker(Worker):
    """A worker whose constructor raises, as one with a bad config or a missing model would."""

    def __init__(self):
        raise RuntimeError("no such model")


def test_a_group_that_fails_to_start_frees_its_bundles(two_nodes):
    # Both CPUs of the cluster go to the broken group; kept, the next group would wait for them until its timeout.
    with pytest.raises(WorkerError, match="no such model"):
        RayWorkerGroup({"actor": (BrokenWorker, {})}, RayPlacement(world_size=2, ready_timeout_s=120))
    group = RayWorkerGroup({"critic": (FragileWorker, {})}, RayPlacement(world_size=2, ready_timeout_s=30))
    group.shutdown()


def test_ppo_under_ray_on_two_nodes_matches_the_single_process_run(two_nodes, tmp_path, monkeypatch, capsys):
    """Two PPO steps with 2 colocated workers (actor+rollout, critic, reference in each), one per node;
    greedy rollouts make the batch fixed, so the first update's losses equal the one-process run's."""
    monkeypatch.chdir(ROOT)
    # One mini-batch per update, so the same rows meet in it on 1 or on 2 ranks.
    common = ["trainer.total_steps=2", "trainer.export_hf=false", "trainer.val_before_train=false",
              "trainer.test_freq=0", "rollout.temperature=0.0", "data.train_batch_size=8",
              "actor.ppo_mini_batch_size=8", "critic.ppo_mini_batch_size=8"]
    run(config(tmp_path / "ray", *common, "trainer.backend=ray", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
               "trainer.device=cpu"))
    placed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ray: 2 rank(s)")]
    assert placed and len(set(eval(placed[0].split("node(s) ")[1]))) == 2, placed
    run(config(tmp_path / "one", *common, "trainer.backend=spmd", "trainer.device=cpu"))
    a, b = by_step(tmp_path / "ray" / "metrics.jsonl"), by_step(tmp_path / "one" / "metrics.jsonl")
    assert sorted(a) == [1, 2]
    for key in ("reward/mean", "response_length/mean", "actor/pg_loss", "critic/vf_loss", "actor/grad_norm"):
        assert a[1][key] == pytest.approx(b[1][key], rel=1e-4, abs=1e-6), key
    assert (tmp_path / "ray" / "checkpoints" / "step_000002" / "COMPLETE").exists()
