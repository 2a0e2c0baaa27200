"""``runner=synthetic``: the real sweep loop on a designed truth, for tests, benchmarks and
what-ifs ("what would adaptive measuring cost at my cluster's noise?").

A truth file (JSON or YAML, ``runner.truth=FILE``) gives each layout's true step time and
how its trials scatter; ``runner.seed=N`` fixes every draw. Nothing is measured: a trial
returns its drawn steps at once, in this process, and is then stored, told to the study,
early-stopped, ranked, recommended and compared exactly as a measured one (the key's
runner is ``synthetic``, so it never mixes with measured keys)::

    layouts:              # key: the a2a size; every layout the plan keeps must be listed
      "1": {median_s: 0.100, noise: {kind: lognormal, cv: 0.02}}
      "2": {median_s: 0.103, noise: {kind: t3, cv: 0.02}}
      "4": {median_s: 0.100, noise: {kind: bimodal, cv: 0.01, p: 0.3, shift: 0.06}}
      "8": {median_s: 0.110, noise: {kind: lognormal, cv: 0.01}, peak_mem_gib: 41.0}
    session: {shift_sd: 0.0, layout_sd: 0.0, drift: 0.0}

**A trial** of layout ``a`` at position ``i`` of the key's trials (its optuna number) has the
step time ``median_s * exp(S + L_a + D_i + e)``: ``e`` the layout's trial-to-trial noise
(``lognormal``: ``cv * Z``; ``t3``: ``cv * T / sqrt(3)``, T ~ Student-t(3), same sd, heavy
tails; ``bimodal``: ``cv * Z`` plus ``log(1 + shift)`` on a share ``p`` of trials), ``S ~
N(0, shift_sd)`` the session's shift and ``L_a ~ N(0, layout_sd)`` the layout's own meeting
with the session (both drawn once per key and seed: one sweep is one session), ``D_i`` the
drift, linear from 0 at the first trial to ``log(1 + drift)`` at the last one a sweep can
run (kept layouts x ``search.repeats``). Its ``measure_steps`` steps scatter around that
by ``step_cv`` (default 0.2%: a trial's steps share its allocation).
"""
from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hcp_tune.errors import InputFileError

KINDS = ("lognormal", "t3", "bimodal")
STEP_CV = 0.002  # default spread of a trial's steps around its drawn step time


@dataclass(frozen=True)
class Noise:
    kind: str = "lognormal"
    cv: float = 0.02
    p: float = 0.0  # bimodal: the share of slow trials
    shift: float = 0.0  # bimodal: how much slower they are (0.06: 6%)
    step_cv: float = STEP_CV


@dataclass(frozen=True)
class LayoutTruth:
    median_s: float
    noise: Noise = field(default_factory=Noise)
    peak_mem_gib: Optional[float] = None


@dataclass(frozen=True)
class Session:
    shift_sd: float = 0.0
    layout_sd: float = 0.0
    drift: float = 0.0


@dataclass(frozen=True)
class Truth:
    layouts: dict[int, LayoutTruth]
    session: Session = field(default_factory=Session)
    source: str = ""

    def missing(self, a2a_sizes: list[int]) -> list[int]:
        """The a2a sizes asked for that the truth does not list."""
        return sorted(a for a in a2a_sizes if a not in self.layouts)


def _bad(source: str, what: str) -> InputFileError:
    return InputFileError(f"runner.truth={source}: {what}")


def _number(source: str, where: str, value: Any, *, low: float = 0.0,
            strict: bool = False, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(source, f"{where}={value!r}: expected a number")
    if value < low or (strict and value == low) or value > high:
        rel = ">" if strict else ">="
        raise _bad(source, f"{where}={value!r}: expected a number {rel} {low:g}"
                   + (f" and <= {high:g}" if math.isfinite(high) else ""))
    return float(value)


def _noise(source: str, where: str, data: Any) -> Noise:
    if data is None:
        return Noise()
    if not isinstance(data, dict):
        raise _bad(source, f"{where}: expected a mapping like {{kind: lognormal, cv: 0.02}}")
    unknown = set(data) - {"kind", "cv", "p", "shift", "step_cv"}
    if unknown:
        raise _bad(source, f"{where}: unknown key(s) {sorted(unknown)}; expected kind, cv, p, "
                   "shift, step_cv")
    kind = data.get("kind", "lognormal")
    if kind not in KINDS:
        raise _bad(source, f"{where}.kind={kind!r}: expected one of {', '.join(KINDS)}")
    cv = _number(source, f"{where}.cv", data.get("cv", 0.02), high=1.0)
    p = _number(source, f"{where}.p", data.get("p", 0.0), high=1.0)
    shift = _number(source, f"{where}.shift", data.get("shift", 0.0), high=10.0)
    if kind == "bimodal" and "p" not in data:
        raise _bad(source, f"{where}: kind=bimodal needs p (the share of slow trials) and shift")
    step_cv = _number(source, f"{where}.step_cv", data.get("step_cv", STEP_CV), high=1.0)
    return Noise(kind, cv, p, shift, step_cv)


def parse_truth(data: Any, source: str = "<truth>") -> Truth:
    """A ``Truth`` from the file's parsed content; ``InputFileError`` (one line) otherwise."""
    if not isinstance(data, dict) or not isinstance(data.get("layouts"), dict) or not data["layouts"]:
        raise _bad(source, "expected a mapping with 'layouts' (a2a size -> {median_s, noise}) "
                   "and optionally 'session'")
    unknown = set(data) - {"layouts", "session"}
    if unknown:
        raise _bad(source, f"unknown key(s) {sorted(unknown)}; expected layouts, session")
    layouts: dict[int, LayoutTruth] = {}
    for name, spec in data["layouts"].items():
        try:
            a2a = int(str(name))
        except ValueError:
            raise _bad(source, f"layouts.{name}: expected an a2a size (an integer)") from None
        where = f"layouts.{name}"
        if a2a < 1:
            raise _bad(source, f"{where}: an a2a size is >= 1")
        if not isinstance(spec, dict):
            raise _bad(source, f"{where}: expected {{median_s: ..., noise: ...}}")
        unknown = set(spec) - {"median_s", "noise", "peak_mem_gib"}
        if unknown:
            raise _bad(source, f"{where}: unknown key(s) {sorted(unknown)}; expected median_s, "
                       "noise, peak_mem_gib")
        if "median_s" not in spec:
            raise _bad(source, f"{where}: median_s (the true step time, seconds) is missing")
        median = _number(source, f"{where}.median_s", spec["median_s"], strict=True)
        mem = spec.get("peak_mem_gib")
        mem = None if mem is None else _number(source, f"{where}.peak_mem_gib", mem)
        layouts[a2a] = LayoutTruth(median, _noise(source, f"{where}.noise", spec.get("noise")), mem)
    sess = data.get("session") or {}
    if not isinstance(sess, dict) or set(sess) - {"shift_sd", "layout_sd", "drift"}:
        raise _bad(source, "session: expected {shift_sd, layout_sd, drift}")
    session = Session(_number(source, "session.shift_sd", sess.get("shift_sd", 0.0), high=1.0),
                      _number(source, "session.layout_sd", sess.get("layout_sd", 0.0), high=1.0),
                      _number(source, "session.drift", sess.get("drift", 0.0), low=-0.9, high=10.0))
    return Truth(layouts, session, source)


def load_truth(path: str | Path) -> Truth:
    """Read and check a truth file (``.json``, else YAML)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise _bad(str(path), f"cannot read it ({e.strerror or e})") from None
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - any parse error is the user's file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _bad(str(path), f"not valid {'JSON' if p.suffix == '.json' else 'YAML'}: "
                   f"{first}") from None
    return parse_truth(data, str(path))


def _rng(*parts: Any) -> Any:
    import numpy as np

    return np.random.default_rng([zlib.crc32(str(p).encode()) for p in parts])


def noise_draw(noise: Noise, rng: Any) -> float:
    """One trial's relative deviation on the log scale (the module docstring's ``e``)."""
    if noise.kind == "t3":
        return noise.cv * float(rng.standard_t(3)) / math.sqrt(3)
    e = noise.cv * float(rng.standard_normal())
    if noise.kind == "bimodal" and rng.random() < noise.p:
        e += math.log1p(noise.shift)
    return e


def session_effects(truth: Truth, seed: int, key: str) -> tuple[float, dict[int, float]]:
    """The key's session: its common shift and each layout's own effect (log scale), drawn
    once per (seed, key) in a2a order, so a resumed sweep meets the same session."""
    rng = _rng("session", seed, key)
    shift = truth.session.shift_sd * float(rng.standard_normal())
    per = {a: truth.session.layout_sd * float(rng.standard_normal())
           for a in sorted(truth.layouts)}
    return shift, per


def draw_steps(truth: Truth, a2a: int, *, seed: int, key: str, number: int,
               position: float, steps: int) -> list[float]:
    """The measured steps of trial ``number`` of layout ``a2a`` in key ``key``;
    ``position``: 0 (the first trial a sweep can run) .. 1 (the last one), for the drift."""
    lay = truth.layouts[a2a]
    shift, per = session_effects(truth, seed, key)
    rng = _rng("trial", seed, key, a2a, number)
    drift = math.log1p(truth.session.drift) * min(max(position, 0.0), 1.0)
    level = math.log(lay.median_s) + shift + per[a2a] + drift + noise_draw(lay.noise, rng)
    return [math.exp(level + lay.noise.step_cv * float(z))
            for z in rng.standard_normal(max(1, steps))]


class Job:
    """A synthetic batch, run in this process one step per poll so that the sweep's own
    early stopping (``sweep_collect``) sees its steps as it would a real job's: each step is
    appended to the trial's progress file, a stop file ends the trial ``pruned`` as the job
    side does (``job.progress``), and each trial's result is written atomically to its
    result file, where the collector reads it."""

    def __init__(self, specs: list[Any], truth: Truth, seed: int, keys: list[str],
                 numbers: list[int], positions: list[float]) -> None:
        self.specs, self.truth, self.seed = specs, truth, seed
        self.keys, self.numbers, self.positions = keys, numbers, positions
        self.index = 0  # the trial running now
        self.done_steps: list[float] = []
        self.drawn: Optional[list[float]] = None
        self.cancelled = False

    @property
    def finished(self) -> bool:
        return self.cancelled or self.index >= len(self.specs)

    def step(self) -> None:
        """One measured step of the running trial (or its end)."""
        from hcp_tune.spec import Status, atomic_write_text, to_json

        if self.finished:
            return
        spec = self.specs[self.index]
        if self.drawn is None:
            i = self.index
            self.drawn = draw_steps(self.truth, spec.a2a, seed=self.seed, key=self.keys[i],
                                    number=self.numbers[i], position=self.positions[i],
                                    steps=spec.measure_steps)
        stop = Path(spec.stop_path) if spec.stop_path else None
        if stop is not None and stop.exists():
            result = _result(spec, self, Status.PRUNED, stop.read_text().strip()
                             or "stopped by the orchestrator")
        else:
            t = self.drawn[len(self.done_steps)]
            self.done_steps.append(t)
            if spec.progress_path:
                Path(spec.progress_path).parent.mkdir(parents=True, exist_ok=True)
                with open(spec.progress_path, "a") as f:
                    f.write(json.dumps({"step": len(self.done_steps) - 1, "time_s": t}) + "\n")
            if len(self.done_steps) < len(self.drawn):
                return
            result = _result(spec, self, Status.OK, None)
        Path(spec.result_path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(spec.result_path, to_json(result))
        self.index += 1
        self.done_steps, self.drawn = [], None


def _result(spec: Any, job: Job, status: Any, error: Optional[str]) -> Any:
    import statistics

    from hcp_tune.noise import percentile
    from hcp_tune.spec import TrialResult

    steps = list(job.done_steps)
    res = TrialResult(trial_id=spec.trial_id, status=status, error=error, step_times_s=steps,
                      world_size=spec.world_size, backend="synthetic")
    if steps:  # summarised as the job side summarises its steps (hcp_tune.noise)
        res.median_s = statistics.median(steps)
        res.p10_s, res.p90_s = percentile(steps, 10), percentile(steps, 90)
    mem = job.truth.layouts[spec.a2a].peak_mem_gib
    res.peak_mem_bytes = None if mem is None else int(mem * 2 ** 30)
    res.verification = {"synthetic": {"truth": job.truth.source, "seed": job.seed}}
    res.fingerprint = {"runner": "synthetic", "truth": job.truth.source, "seed": job.seed}
    return res


_SUBMITTED = [0]  # in-process jobs submitted by this process (their ids)


def truth_for(cfg: Any) -> Truth:
    """The sweep's truth (``runner.truth``), read and checked before anything is written."""
    if not cfg.runner.truth:
        raise InputFileError("runner=synthetic needs runner.truth=FILE: the layouts' true step "
                             "times and noise (docs/guides/ranking.md shows one)")
    return load_truth(cfg.runner.truth)


def check_kept(truth: Truth, kept_keys: dict[Any, list[Any]]) -> None:
    """Every layout the plan keeps must be in the truth: one line naming those missing."""
    for key, kept in kept_keys.items():
        missing = truth.missing([c.layout.a2a for c in kept])
        if missing:
            listed = ", ".join(str(a) for a in sorted(truth.layouts))
            raise InputFileError(
                f"runner.truth={truth.source}: no layout for a2a size(s) "
                f"{', '.join(map(str, missing))} of cp={key.cp} (it lists {listed}); every "
                "layout the plan keeps needs an entry under 'layouts'")


def check_sweep(cfg: Any) -> Truth:
    """The truth file read and every kept layout found in it, before a sweep writes."""
    from hcp_tune.engine.sweep_plan import kept_by_key

    truth = truth_for(cfg)
    check_kept(truth, kept_by_key(cfg))
    return truth


def submit(truth: Truth, cfg: Any, members: list[Any], folder: Any) -> Any:
    """An in-process job for one batch (``dispatch.JobHandle`` with executor ``inprocess``)."""
    import os

    from hcp_tune.engine.dispatch import JobHandle

    most = max(1, max(len(m.kept) for m in members) * cfg.search.repeats - 1)
    job = Job([m.spec for m in members], truth, cfg.runner.seed,
              [m.key.name for m in members], [m.number for m in members],
              [m.number / most for m in members])
    _SUBMITTED[0] += 1
    return JobHandle(job_id=f"synthetic-{os.getpid()}-{_SUBMITTED[0]}", executor="inprocess",
                     folder=Path(folder), job=job)
