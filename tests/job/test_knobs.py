"""The job's answer-changing settings and the HCP_TUNE_INJECT_DELAY test knob."""
import pytest

from hcp_tune.job import knobs


def test_settings_keep_nccl_nvte_and_cuda_connections_but_not_our_own_debug_switches():
    env = {"NCCL_ALGO": "Ring", "NVTE_FUSED_ATTN": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
           "NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "2", "HOME": "/root", "CUDA_HOME": "/x"}
    assert knobs.settings(env) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_ALGO": "Ring",
                                   "NVTE_FUSED_ATTN": "0"}


@pytest.mark.parametrize("text,parsed", [("", None), ("p2p:0.05", ("p2p", 0.05)),
                                         ("a2a:0", ("a2a", 0.0)), (" a2a:2 ", ("a2a", 2.0))])
def test_parse_delay(text, parsed):
    assert knobs.parse_delay(text) == parsed


@pytest.mark.parametrize("text", ["p2p", "ring:0.1", "p2p:-1", "p2p:fast", "p2p:nan"])
def test_parse_delay_rejects_with_the_fix(text):
    with pytest.raises(ValueError, match=r"HCP_TUNE_INJECT_DELAY=.*expected <level>:<seconds> "
                                         r"with level one of a2a, p2p"):
        knobs.parse_delay(text)


def test_delay_sleeps_only_on_its_level_and_is_recorded(monkeypatch):
    slept = []
    monkeypatch.setattr(knobs.time, "sleep", slept.append)
    monkeypatch.delenv(knobs.INJECT_ENV, raising=False)
    knobs.comm_delay("p2p")
    assert slept == [] and knobs.injected_delay() is None
    monkeypatch.setenv(knobs.INJECT_ENV, "p2p:0.25")
    knobs.comm_delay("a2a")
    knobs.comm_delay("p2p")
    assert slept == [0.25] and knobs.injected_delay() == "p2p:0.25"
