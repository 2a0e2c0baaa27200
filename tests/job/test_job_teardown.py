"""Many trials in one set of processes leave nothing behind (issue 8, item 4).

Megatron-Core's ``destroy_model_parallel`` forgets its groups without destroying them; a
job that runs trial after trial would pile up communicators (on gloo: sockets). Each trial
records, before it makes its own groups, how many file descriptors its rank 0 holds and
how many process groups torch.distributed still knows: both must stay flat.
"""
import pytest
from helpers import make_spec

from hcp_tune.space.layout import Layout
from hcp_tune.spec import Status

pytestmark = pytest.mark.multiproc

TRIALS = 21


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    from hcp_tune.engine.launch import run_local_batch

    layouts = [Layout(1, 2), Layout(2, 1)]
    specs = [make_spec(layouts[i % 2], seq=32, trial_id=f"t{i:02d}", warmup_steps=0,
                       measure_steps=1) for i in range(TRIALS)]
    return run_local_batch(specs, workdir=tmp_path_factory.mktemp("many"))


def test_every_trial_of_a_long_batch_is_ok(many):
    assert [r.status for r in many] == [Status.OK] * TRIALS, [r.error for r in many]


def test_process_groups_do_not_pile_up(many):
    groups = [r.resources["process_groups"] for r in many]
    assert groups == [1] * TRIALS, groups  # only the world group between trials


def test_open_file_descriptors_do_not_grow(many):
    fds = [r.resources["open_fds"] for r in many]
    # the first trial starts before any trial group existed; from the second on, each
    # starts after a full teardown: the count must come back to the same value
    # (the first one's count is lower: torch opens a few descriptors lazily, once)
    assert len(set(fds[1:])) == 1, fds
