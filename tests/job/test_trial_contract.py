"""TrialSpec / TrialResult: JSON round-trip and the stdlib failure-text helpers."""
import json

import pytest

from hcp_tune.spec import (
    FailureClass,
    Status,
    TrialResult,
    TrialSpec,
    classify_error_text,
    first_error_line,
    result_from_json,
    spec_from_json,
    to_json,
)


def _spec():
    return TrialSpec(trial_id="t1", a2a=2, p2p=4, tp=2, seq=4096, heads=32, kv_heads=8,
                     head_dim=128, expected_groups={"cp": [[0, 2]], "a2a": [[0]], "p2p": [[2]]},
                     peak_tflops=989.0, inject_fault="cp_off")


def test_spec_round_trips_through_json():
    spec = _spec()
    back = spec_from_json(to_json(spec))
    assert back == spec and back.cp == 8 and back.world_size == 16 and back.comm_type == "a2a+p2p"


def test_result_round_trips_through_json_with_enums():
    res = TrialResult(trial_id="t1", status=Status.INVALID, failure_class=FailureClass.NUMERICS,
                      error="out error 1.3 > tolerance 1e-05", step_times_s=[0.1, 0.2],
                      median_s=0.15, verification={"numerics": {"passed": False}},
                      fingerprint={"torch": "2.13"}, wall_s=3.0, flops_per_gpu_step=1e9)
    text = to_json(res)
    assert json.loads(text)["status"] == "invalid"
    assert result_from_json(text) == res


def test_unknown_field_is_rejected_with_its_name():
    data = json.loads(to_json(_spec()))
    data["cp_size"] = 8
    with pytest.raises(ValueError, match=r"TrialSpec: unknown fields \['cp_size'\]"):
        spec_from_json(json.dumps(data))


def test_first_error_line_skips_traceback_and_source_location():
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Connection closed by peer\nmore")
    assert first_error_line(text) == "RuntimeError: Connection closed by peer"


@pytest.mark.parametrize("text, cls", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB", FailureClass.OOM),
    ("RuntimeError: Connection closed by peer [127.0.0.1]:1234", FailureClass.COMM),
    ("DistBackendError: NCCL error in: ... remote process exited", FailureClass.COMM),
    ("ModuleNotFoundError: No module named 'transformer_engine'", FailureClass.ENVIRONMENT),
    ("TimeLimitReached: time limit reached after 3 of 7 steps", FailureClass.TIME_LIMIT),
    ("ValueError: something else", FailureClass.UNKNOWN),
])
def test_error_text_is_classified(text, cls):
    assert classify_error_text(text) == cls


def test_a_fault_is_planted_only_through_its_environment_variable():
    from hcp_tune.spec import FAULT_ENV, fault_from_env

    assert fault_from_env(512, {}) is None
    assert fault_from_env(512, {FAULT_ENV: ""}) is None  # empty counts as unset
    assert fault_from_env(512, {FAULT_ENV: "cp_off"}) == "cp_off"
    assert fault_from_env(512, {FAULT_ENV: "kill_rank@512"}) == "kill_rank"
    assert fault_from_env(1024, {FAULT_ENV: "kill_rank@512"}) is None
    for bad in ("oops", "cp_off@x", "@512"):
        with pytest.raises(ValueError, match=f"{FAULT_ENV}='{bad}': expected <fault>"):
            fault_from_env(512, {FAULT_ENV: bad})
