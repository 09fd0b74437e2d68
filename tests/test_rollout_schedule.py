"""The rollout schedule the trainer's config picks, and the settings it refuses."""
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from verl.trainer.rollout_schedule import OffPolicySchedule, StreamingSchedule, SyncSchedule, make_schedule


def cfg_of(off_policy_steps=0, in_flight=0, max_staleness=1, batch=4, dynamic=False):
    return OmegaConf.create({"trainer": {"off_policy_steps": off_policy_steps, "max_staleness": max_staleness},
                             "rollout": {"in_flight": in_flight}, "data": {"train_batch_size": batch},
                             "algorithm": {"dynamic_sampling": {"enable": dynamic}}})


def test_the_config_picks_one_schedule():
    assert type(make_schedule(None, cfg_of())) is SyncSchedule
    ahead = make_schedule(None, cfg_of(off_policy_steps=1))
    assert type(ahead) is OffPolicySchedule and ahead.off_policy and ahead.overlaps_update
    ahead.close()
    stream = make_schedule(None, cfg_of(in_flight=8, max_staleness=2))
    assert type(stream) is StreamingSchedule and stream.off_policy and not stream.overlaps_update
    assert (stream.in_flight, stream.max_staleness) == (8, 2)


@pytest.mark.parametrize("settings, ranks, why", [
    ({"off_policy_steps": 2}, 1, "off_policy_steps must be 0 or 1, got 2"),
    ({"off_policy_steps": 1}, 2, "not under torchrun with 2 processes"),
    ({"in_flight": 2}, 1, "in_flight=2 must be >= data.train_batch_size=4"),
    ({"in_flight": 8, "max_staleness": -1}, 1, "max_staleness must be >= 0"),
    ({"in_flight": 8, "off_policy_steps": 1}, 1, "pick one"),
    ({"in_flight": 8, "dynamic": True}, 1, "dynamic_sampling is not built"),
    ({"in_flight": 8}, 2, "not 2 torchrun ranks"),
])
def test_settings_that_do_not_fit_are_refused(settings, ranks, why):
    with pytest.raises(ValueError, match=why):
        make_schedule(None, cfg_of(**settings), SimpleNamespace(world_size=ranks))
