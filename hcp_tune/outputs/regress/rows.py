"""What ``regress`` reads from a stored row: the key it belongs to, whether it counts, its
fingerprint, whether its memory figure is a per-trial device reading, and the warnings about
rows that must not be pooled (an injected delay, versions that differ under one tag).

Pure functions of stored rows (standard library only).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, Optional

from hcp_tune.store.records import OLDER_ROW_DEFAULTS, key_field
from hcp_tune.stats.verdict import usable  # noqa: F401  (the one definition)
from hcp_tune.errors import HcpError

# the sweep key without env_tag (mix: a packed key's length mix, "" for fixed length, so a
# packed key is never compared with a fixed-length one; older rows read as "")
COMPARED = ("cluster", "model", "tp", "pp", "cp", "seq", "runner", "dp", "mbs", "micro_batches",
            "mix")
IGNORED_FINGERPRINT = ("hosts",)  # host names alone never make rows differ

# What a row's ``mem_note`` says when its peak memory is a device reading (the job's
# bench.py: the CUDA allocator; the Bridge runner: device memory used or max reserved)
DEVICE_MEMORY_NOTES = ("torch.cuda.", "max_memory_allocated", "max_memory_reserved",
                       "device memory used")




_NUMBER = re.compile(r"-t(\d+)(?:-|$)")


def position(row: dict[str, Any]) -> tuple:
    """A trial's place in its key's plan: the number in its ``trial_id`` (``<slug>-t<n>-a<a2a>``,
    the optuna trial number), so trial 1000 follows 999; a foreign id sorts first, by text."""
    tid = str(row.get("trial_id", ""))
    m = _NUMBER.search(tid)
    return (int(m.group(1)), tid) if m else (-1, tid)


class RegressError(HcpError):
    """Bad input to ``regress`` (exit 2): unknown tag, no common keys, too few trials."""


def key_text(key: tuple) -> str:
    """The key as the user types it; pp=1 is left out, as in the sweep key's name."""
    return " ".join(f"{k}={v}" for k, v in zip(COMPARED, key) if v != OLDER_ROW_DEFAULTS.get(k))


def row_key(r: dict[str, Any]) -> tuple:
    """A row's COMPARED values; a row stored before pp joined the key has pp=1."""
    return tuple(key_field(r, k) for k in COMPARED)


def fingerprint_of(row: dict[str, Any]) -> dict[str, Any]:
    fp = row.get("fingerprint") or {}
    if isinstance(fp, str):
        try:
            fp = json.loads(fp)
        except json.JSONDecodeError:
            fp = {}
    return fp if isinstance(fp, dict) else {}


def memory_not_measured(row: Mapping[str, Any], fingerprint: Mapping[str, Any]) -> Optional[str]:
    """Why a row's ``peak_mem_bytes`` is not a per-trial device measurement, or None when
    it is. Read from what the row records: its ``mem_note`` (what the job measured), and,
    for an older row without one, the fingerprint's ``gpu`` (older GPU rows hold the CUDA
    allocator's peak; older CPU rows the process's peak-RSS growth)."""
    value = row.get("peak_mem_bytes")
    if not isinstance(value, (int, float)) or math.isnan(value):
        return "no memory figure recorded"
    note = str(row.get("mem_note") or "")
    if note:
        if any(mark in note for mark in DEVICE_MEMORY_NOTES):
            return None
        return f"not a per-trial device measurement ({note.split(',')[0]})"
    if fingerprint.get("gpu"):
        return None
    return "not a per-trial device measurement (no GPU in the row's fingerprint)"


def injected_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """One line per tag whose rows carry an injected delay (HCP_TUNE_INJECT_DELAY)."""
    found: dict[str, dict[str, int]] = {}
    for r in rows:
        delay = fingerprint_of(r).get("inject_delay")
        if delay:
            tag = found.setdefault(str(r.get("env_tag")), {})
            tag[delay] = tag.get(delay, 0) + 1
    return [f"{tag}: {sum(d.values())} trial(s) ran with an injected delay "
            f"(HCP_TUNE_INJECT_DELAY={', '.join(sorted(d))}): a testing aid, not a real "
            "measurement" for tag, d in sorted(found.items())]


def _flat(fp: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in fp.items():
        if k in IGNORED_FINGERPRINT or v is None:
            continue  # None and absent (a row from an older job) both read "unset"
        if isinstance(v, dict):
            for sk, sv in v.items():
                out[f"{k}.{sk}"] = str(sv)
        else:
            out[k] = str(v)
    return out


def drift_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """One line per tag whose rows' versions or settings differ (host names excluded)."""
    lines = []
    for tag in sorted({str(r.get("env_tag")) for r in rows}):
        flats = [_flat(fingerprint_of(r)) for r in rows if str(r.get("env_tag")) == tag
                 and fingerprint_of(r)]
        names = sorted({k for f in flats for k in f})
        diffs = []
        for name in names:
            counts: dict[str, int] = {}
            for f in flats:
                value = f.get(name, "unset")
                counts[value] = counts.get(value, 0) + 1
            if len(counts) > 1:
                diffs.append(f"{name} (" + ", ".join(f"{v} x{n}" for v, n in sorted(counts.items()))
                             + ")")
        if diffs:
            lines.append(f"{tag}: rows under this tag differ in {'; '.join(diffs)}: they are "
                         "pooled as one stack; give each stack its own env_tag")
    return lines
