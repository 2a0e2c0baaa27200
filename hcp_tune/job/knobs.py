"""What in a job's environment changes the answer, and the test knob that injects delays.

Standard library only (job side). Two things live here:

- ``settings()``: the environment variables that change what a trial measures, recorded in
  the result's fingerprint so that rows under one ``env_tag`` whose settings differ are
  reported rather than pooled: every ``NCCL_*`` (algorithms, protocols, channels, the
  network), ``CUDA_DEVICE_MAX_CONNECTIONS`` (Megatron-Core sets it to 1 for
  communication/compute overlap) and every ``NVTE_*`` switch (``NVTE_FLASH_ATTN``,
  ``NVTE_FUSED_ATTN``, ``NVTE_FUSED_ATTN_BACKEND``, ...). ``NVTE_DEBUG``,
  ``NVTE_DEBUG_LEVEL`` and NCCL's logging switches are left out: the job sets them itself
  to read TE's backend choice and NCCL's transports.
- ``HCP_TUNE_INJECT_DELAY=<level>:<seconds>`` (level ``a2a`` or ``p2p``), a **testing aid**,
  off by default: ``comm_delay(level)`` sleeps that many seconds before each of that
  level's communication steps in the pure-torch reference attention (every all-to-all of
  the a2a level; every ring transfer of the p2p level, forward and backward). It exists
  so a regression check can be shown to catch a slowdown of one level. Transformer
  Engine's path does not honour it (its communication happens inside TE): there the
  delay is still recorded, so the row is flagged either way. ``injected_delay()`` is what
  the fingerprint records; ``regress`` and ``recommend`` flag every row that carries one,
  so such a row can never pass as a real measurement.
"""
from __future__ import annotations

import os
import time
from typing import Optional

INJECT_ENV = "HCP_TUNE_INJECT_DELAY"
LEVELS = ("a2a", "p2p")
SETTING_PREFIXES = ("NCCL_", "NVTE_")
SETTING_NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS",)
# set by the job to read TE's backend choice and NCCL's transports (logging only: they
# change no kernel, and a row must not differ from another by them)
OWN_SETTINGS = ("NVTE_DEBUG", "NVTE_DEBUG_LEVEL", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
                "NCCL_DEBUG_FILE")


def settings(environ: Optional[dict] = None) -> dict[str, str]:
    """The answer-changing settings of this environment, sorted by name."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env)
            if (k.startswith(SETTING_PREFIXES) or k in SETTING_NAMES) and k not in OWN_SETTINGS}


def parse_delay(text: str) -> Optional[tuple[str, float]]:
    """``"p2p:0.05"`` -> ``("p2p", 0.05)``; ``""`` -> None; anything else a ValueError."""
    text = text.strip()
    if not text:
        return None
    level, sep, seconds = text.partition(":")
    try:
        value = float(seconds) if sep else -1.0
    except ValueError:
        value = -1.0
    if level not in LEVELS or not value >= 0:
        raise ValueError(
            f"{INJECT_ENV}={text!r}: expected <level>:<seconds> with level one of "
            f"{', '.join(LEVELS)} and seconds >= 0, e.g. {INJECT_ENV}=p2p:0.05 (a testing "
            f"aid; unset it for real measurements)")
    return level, value


def injected_delay() -> Optional[str]:
    """What the fingerprint records: the knob's value as set (``"p2p:0.05"``), or None."""
    parsed = parse_delay(os.environ.get(INJECT_ENV, ""))
    return f"{parsed[0]}:{parsed[1]:g}" if parsed else None


def comm_delay(level: str) -> None:
    """Sleep the injected delay if it is set for ``level`` (a no-op otherwise)."""
    raw = os.environ.get(INJECT_ENV)
    if not raw:
        return
    parsed = parse_delay(raw)
    if parsed and parsed[0] == level and parsed[1] > 0:
        time.sleep(parsed[1])
