"""runner=bridge measurements: the step-recording callback driven by plain objects in the
shape Bridge v0.6.0's train loop passes, and the log-line fallback on Bridge's formats."""
from types import SimpleNamespace

import pytest
import torch

from hcp_tune.job.bridge.measure import (
    GB,
    RankMemory,
    StepRecorder,
    lm_loss,
    parse_log,
    step_time_lines,
)


class Clock:
    """A clock the test advances by hand: step durations are exact, nothing sleeps."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def context(step, flops=0.0, loss=None):
    state = SimpleNamespace(train_state=SimpleNamespace(
        step=step, floating_point_operations_so_far=flops))
    return SimpleNamespace(state=state, loss_dict=loss, skipped_iter=False)


def run_steps(rec, clock, durations, flops_per_step=100.0):
    syncs = []
    rec.sync = lambda: syncs.append(clock.now)
    rec.on_train_start(context(0, 0.0))
    flops = 0.0
    for i, d in enumerate(durations):
        rec.on_train_step_start(context(i, flops))
        clock.now += d
        rec.on_train_step_end(context(i, flops, {"lm loss": torch.tensor(10.0 - i)}))
        flops += flops_per_step  # Bridge adds the step's FLOPs after on_train_step_end
    rec.on_train_end(context(len(durations), flops))
    return syncs


def test_recorder_times_measured_steps_with_syncs_and_losses():
    clock, seen = Clock(), []
    rec = StepRecorder(warmup_steps=2, clock=clock, on_measured_step=lambda i, t: seen.append((i, t)))
    syncs = run_steps(rec, clock, [5.0, 3.0, 1.0, 2.0, 1.5])
    assert len(syncs) == 10  # a device sync before and after every step
    m = rec.result(world_size=4, flops_per_step_ported=100.0)
    assert m.source == "callbacks"
    assert m.step_times_s == [1.0, 2.0, 1.5]
    assert m.lm_losses == [10.0, 9.0, 8.0, 7.0, 6.0]
    assert seen == [(0, 1.0), (1, 2.0), (2, 1.5)]
    assert m.flops_per_step == 100.0
    assert m.tflops_per_gpu == pytest.approx(100.0 / 1.5 / 4 / 1e12)  # median 1.5 s


def test_recorder_prefers_bridges_flop_count_and_notes_the_port():
    clock = Clock()
    rec = StepRecorder(warmup_steps=0, clock=clock)
    run_steps(rec, clock, [1.0, 1.0], flops_per_step=2e12)
    m = rec.result(world_size=2, flops_per_step_ported=1e12)
    assert m.flops_per_step == 2e12
    assert m.tflops_per_gpu == pytest.approx(1.0)
    assert "ratio 2.000" in m.notes[0]


def test_recorder_falls_back_to_the_port_without_bridges_count():
    clock = Clock()
    rec = StepRecorder(warmup_steps=0, clock=clock)
    rec.on_train_step_start(SimpleNamespace(state=None, loss_dict=None))
    clock.now += 2.0
    rec.on_train_step_end(SimpleNamespace(state=None, loss_dict=None))
    m = rec.result(world_size=1, flops_per_step_ported=4e12)
    assert m.flops_per_step == 4e12 and m.tflops_per_gpu == pytest.approx(2.0)
    assert m.lm_losses == [None]


def test_recorder_gathers_every_ranks_memory_and_ranks_them():
    mems = [RankMemory(rank=0, max_reserved=5 * 2**30, max_allocated=4 * 2**30),
            RankMemory(rank=1, max_reserved=7 * 2**30, max_allocated=6 * 2**30)]
    rec = StepRecorder(warmup_steps=0, memory=lambda: mems[0], gather=lambda mine: mems)
    rec.on_train_end(context(0))
    m = rec.result(world_size=2, flops_per_step_ported=None)
    assert m.peak_memory() == (7 * 2**30, "torch max_memory_reserved, max over ranks")
    mems[0].device_used, mems[0].device_used_source = 9 * 2**30, "nvml"
    assert m.peak_memory()[0] == 9 * 2**30 and "nvml" in m.peak_memory()[1]


def test_the_peak_adds_what_the_allocator_cannot_see_and_retries_are_a_note():
    """issue 38: NVML's used memory read once at train end is not the peak; the allocator's
    peak plus the largest per-step (used - reserved) is, and retries mean near-OOM."""
    mems = [RankMemory(rank=0, max_reserved=5 * 2**30, outside_allocator=2**30, alloc_retries=0,
                       device_used=4 * 2**30),
            RankMemory(rank=1, max_reserved=7 * 2**30, outside_allocator=2**29, alloc_retries=3)]
    samples = []
    rec = StepRecorder(warmup_steps=0, memory=lambda: mems[0], gather=lambda mine: mems,
                       sample=lambda: samples.append(len(rec.steps)))
    rec.on_train_step_start(context(0))
    rec.on_train_step_end(context(0))
    assert samples == [0]  # once per step, after its time was taken (outside it)
    rec.on_train_end(context(1))
    m = rec.result(world_size=2, flops_per_step_ported=None)
    peak, note = m.peak_memory()
    assert peak == 7 * 2**30 + 2**29 and note.startswith("torch max_memory_reserved + memory "
                                                         "outside the allocator")
    assert any(n.startswith("the CUDA allocator retried 3 time(s)") for n in m.notes)


@pytest.mark.parametrize("value,expected", [
    (torch.tensor(2.5), 2.5), (torch.tensor([6.0, 3.0]), 2.0), ((6.0, 3.0), 2.0), (1.25, 1.25),
])
def test_lm_loss_shapes(value, expected):
    assert lm_loss({"lm loss": value}) == pytest.approx(expected)
    assert lm_loss({}) is None and lm_loss(None) is None


def test_negative_warmup_is_refused_with_its_value():
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        StepRecorder(warmup_steps=-1)


# ---------------------------------------------------------------- Bridge's log lines
# the formats of Megatron-Bridge v0.6.0 training/utils/train_utils.py training_log

def iteration_line(i, n, ms, loss, tflops=None):
    line = (f" [2026-12-02 17:00:0{i % 10}] iteration {i:8d}/{n:8d} | consumed samples: "
            f"{i:12d} | elapsed time per iteration (ms): {ms:.1f} |")
    if tflops is not None:
        line += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    line += (f" learning rate: {3e-4:.6E} | global batch size: {1:5d} | lm loss: {loss:.6E} |"
             f" loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations: {0:3d} |"
             f" number of nan iterations: {0:3d} |")
    return line


LOG = "\n".join([
    "Step Time : 1.50s GPU utilization: 400.0MODEL_TFLOP/s/GPU",
    iteration_line(1, 5, 1500.0, 10.5, 400.0),
    "[Rank 0] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 1.5 | "
    "mem-active-gigabytes: 1.5 | mem-inactive-gigabytes: 0.1 | mem-reserved-gigabytes: 2.0 | "
    "mem-max-allocated-gigabytes: 3.25 | mem-max-active-gigabytes: 3.25 | "
    "mem-max-inactive-gigabytes: 0.2 | mem-max-reserved-gigabytes: 4.5 | mem-alloc-retires: 0 | "
    "mem-allocated-count: 812",
    "[Rank 1] (after 1 iterations) memory (GB) | mem-max-allocated-gigabytes: 3.5 | "
    "mem-max-reserved-gigabytes: 5.125",
    iteration_line(2, 5, 1200.0, 9.75, 420.0),
    "Step Time : 1.00s GPU utilization: 500.0MODEL_TFLOP/s/GPU",
    iteration_line(3, 5, 1000.0, 9.0, 500.0),
    iteration_line(4, 5, 1100.0, 8.5, 480.0),
    "[Rank 0] (after 2 iterations) memory (GB) | mem-max-allocated-gigabytes: 3.0 | "
    "mem-max-reserved-gigabytes: 4.75",
    iteration_line(5, 5, 1050.0, 8.25, 490.0),
])


def test_parse_log_takes_measured_steps_tflops_losses_and_peak_memory():
    m = parse_log(LOG, warmup_steps=2, world_size=2)
    assert m.source == "log"
    assert m.step_times_s == [1.0, 1.1, 1.05]
    assert m.tflops_per_gpu == 490.0  # median of 500, 480, 490
    assert m.lm_losses == [10.5, 9.75, 9.0, 8.5, 8.25]
    assert [(r.rank, r.max_reserved, r.max_allocated) for r in m.memory] == [
        (0, int(4.75 * GB), int(3.25 * GB)), (1, int(5.125 * GB), int(3.5 * GB))]
    assert m.peak_memory()[0] == int(5.125 * GB)


def test_parse_log_without_throughput_field_says_so():
    text = "\n".join(iteration_line(i, 4, 900.0 + i, 9.0) for i in range(1, 5))
    m = parse_log(text, warmup_steps=1, world_size=4)
    assert m.step_times_s == [0.902, 0.903, 0.904]
    assert m.tflops_per_gpu is None
    assert "no throughput field" in m.notes[0]


def test_step_time_lines():
    assert step_time_lines(LOG) == [(1.5, 400.0), (1.0, 500.0)]
