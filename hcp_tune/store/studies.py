"""The optuna side of a sweep: one study per sweep key, the one ledger of a sweep.

The layout space is small (the divisors of CP), so every kept layout is measured: each is
enqueued and asked for in order (best-predicted first when the cost model ordered them).
Two objectives, step time and peak memory, both minimised. Each study lives in its own
journal file under ``results/journals/`` (``Journals``: safe on a cluster's shared file
system, and replayed only when its key is used), or every study in one optuna storage
(an RDB URL or one journal file). A study records what was asked, submitted (job id, for re-attachment) and returned:
on ``tell`` the trial's whole row rides on it as user attributes (``row_attrs``), with
its state: ok -> COMPLETE (values: median step s, peak memory bytes), pruned or skipped
-> PRUNED, failed / invalid / cancelled -> FAIL; ``status`` and ``failure_class`` say
which. The row files and tables under ``results/`` are views rebuilt from it
(``Ledger``, ``store.ResultStore.rebuild``). The storages themselves (a journal per key, a database) are ``journals``.
"""
from __future__ import annotations

import json
import math
import os
import socket
import warnings
from dataclasses import dataclass
from typing import Any, Collection, Optional

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from hcp_tune.store.journals import Journals, open_storage, storage_for
from hcp_tune.store.records import name_slug, row_text
from hcp_tune.spec import Status

optuna.logging.set_verbosity(optuna.logging.WARNING)


# A row is stored as ASCII JSON in parts of at most this many characters: optuna's RDB
# storage keeps a user attribute's JSON in a TEXT column, 65,535 bytes on MySQL, and JSON
# escaping at most doubles ASCII text. A long error or step list spans several parts.
ROW_PART_CHARS = 16_000
ERROR_ATTR_CHARS = 200
METRIC_NAMES = ("median_step_s", "peak_mem_bytes")  # a trial's two values  # the error's first line, shown as its own attribute


def row_attrs(row: dict[str, Any]) -> dict[str, Any]:
    """A row as a trial's user attributes: the few a reader scans (trial id, layout,
    status, failure class, the error's first line) and the whole row in parts."""
    text = row_text(row)
    parts = [text[i:i + ROW_PART_CHARS] for i in range(0, len(text), ROW_PART_CHARS)]
    error = str(row.get("error") or "").split("\n")[0][:ERROR_ATTR_CHARS]
    return {"trial_id": row["trial_id"], "layout": f"[{row['a2a']},{row['p2p']}]",
            "status": row["status"], "failure_class": row.get("failure_class") or "",
            "error": error, "row_parts": len(parts),
            **{f"row.{i}": part for i, part in enumerate(parts)}}


def row_text_of(trial: FrozenTrial) -> Optional[str]:
    """The row a trial holds, as stored (JSON text), or None (not told with a row)."""
    attrs = trial.user_attrs
    n = attrs.get("row_parts")
    if not isinstance(n, int) or any(f"row.{i}" not in attrs for i in range(n)):
        return None
    return "".join(attrs[f"row.{i}"] for i in range(n))


def state_of(row: dict[str, Any]) -> tuple[TrialState, Optional[list[float]]]:
    """ok (with a median, and proof that CP was active) -> COMPLETE with (median step s,
    peak memory bytes); pruned and skipped (stopped early, or never started: predicted too
    slow) -> PRUNED; the rest (failed, invalid, cancelled, an ok row without proof) -> FAIL,
    so the study's Pareto front holds only what the tables may rank."""
    median = row.get("median_s")
    if row["status"] == Status.OK.value and row.get("verified") is True \
            and isinstance(median, (int, float)) and math.isfinite(median):
        return TrialState.COMPLETE, [float(row["median_s"]), float(row.get("peak_mem_bytes") or 0)]
    if row["status"] in (Status.PRUNED.value, Status.SKIPPED.value):
        return TrialState.PRUNED, None
    return TrialState.FAIL, None


@dataclass
class Outstanding:
    """A trial submitted by an earlier orchestrator and not yet stored."""

    number: int
    a2a: int
    trial_id: str
    job_id: str
    executor: str
    folder: str


class LayoutStudy:
    """Ask/tell over the kept a2a sizes of one sweep key.

    The study's ``a2a`` parameter has one value space for its whole life (optuna refuses a
    trial whose categorical choices differ from the study's earlier ones): every a2a size
    of the key's CP (``space``), whatever a sweep keeps (``search.a2a_sizes``, skipped
    layouts, the prediction's order). A study that began with a narrower space (written
    before) keeps it; a layout outside it carries its a2a as a user attribute instead."""

    def __init__(self, storage: Any, name: str, kept_a2a: list[int],
                 space: Collection[int] = ()) -> None:
        self.kept = list(kept_a2a)
        self.space = sorted(set(space) | set(self.kept))
        self._dist: Optional[CategoricalDistribution] = None
        storage = storage_for(storage, name)
        self.study = optuna.create_study(
            storage=storage, study_name=name, directions=["minimize", "minimize"],
            load_if_exists=True,
        )
        if self.study.metric_names is None:  # what optuna-dashboard labels the values with
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self.study.set_metric_names(list(METRIC_NAMES))
        self._live: dict[int, optuna.Trial] = {}

    def outstanding(self, stored_ids: set[str]) -> list[Outstanding]:
        """Submitted trials whose result was never stored: re-attach to them (not to those
        of a sweep still running on this host: in a shared database, another user's)."""
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            attrs = t.user_attrs
            if _submitted(attrs) and attrs["trial_id"] not in stored_ids \
                    and not _live_elsewhere(attrs):
                out.append(Outstanding(t.number, trial_a2a(t), attrs["trial_id"],
                                       attrs["job_id"], attrs["executor"], attrs["folder"]))
        return out

    def abandon_unsubmitted(self) -> None:
        """Trials asked for but never submitted (killed in between) end as FAIL."""
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if not _submitted(t.user_attrs) and not _live_elsewhere(t.user_attrs):
                self.study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)

    def ask(self, a2a: int, trial_id_prefix: str) -> tuple[int, str, int]:
        """Start a trial for layout ``a2a``; returns (trial number, trial id, a2a it got)."""
        dist = self._a2a_distribution()
        inside = dist is not None and a2a in dist.choices
        # the trial carries its orchestrator from the start: a sweep starting meanwhile on
        # this host sees a live sweep's trial, not an abandoned one (``abandon_unsubmitted``)
        attrs = {"orchestrator": ORCHESTRATOR, **({} if inside else {"a2a": a2a})}
        for _ in range(ASK_TRIES):
            self.study.enqueue_trial({"a2a": a2a}, user_attrs=attrs)
            trial = self.study.ask()
            try:
                # what we got (another orchestrator may have taken our enqueued trial): a
                # layout outside the study's space says so in an attribute, the rest is its
                # parameter
                got = int(trial.user_attrs["a2a"]) if "a2a" in trial.user_attrs else \
                    trial.suggest_categorical("a2a", dist.choices if dist else [a2a])
                trial_id = f"{trial_id_prefix}-t{trial.number:03d}-a{got}"
                trial.set_user_attr("trial_id", trial_id)
                trial.set_user_attr("orchestrator", ORCHESTRATOR)  # who asked
            except UpdateFinishedTrialError:
                continue  # a sweep on another host took it for abandoned already: ask again
            self._live[trial.number] = trial
            return trial.number, trial_id, got
        raise UpdateFinishedTrialError(
            f"study {self.study.study_name}: {ASK_TRIES} trials in a row were ended by another "
            "sweep before this one could mark them its own")

    def submitted(self, number: int, job_id: str, executor: str, folder: str) -> None:
        """Mark a trial submitted; ``job_id`` last, so a trial holding it holds all three
        (an orchestrator killed half-way leaves a trial ``abandon_unsubmitted`` ends). A
        trial another sweep ended meanwhile (from another host, taken for abandoned) is
        left so: its result is stored as a new trial when it comes (``tell``)."""
        trial = self._live[number]
        try:
            for k, v in (("executor", executor), ("folder", folder), ("job_id", job_id)):
                trial.set_user_attr(k, v)
        except UpdateFinishedTrialError:
            pass


    def not_run(self, number: int) -> None:
        """A submitted trial its batch job never ran: FAIL, marked so (it is asked again)."""
        trial = self._live.get(number)
        if trial is not None:  # (a re-attached trial has no live handle: FAIL says enough)
            trial.set_user_attr("not_run", True)
        self.study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        self._live.pop(number, None)

    def tell(self, number: int, status: Status, values: Optional[tuple[float, float]],
             row: Optional[dict[str, Any]] = None) -> None:
        """End trial ``number``; with ``row``, the row rides on it and decides its state
        and values. A trial already ended elsewhere (a rebuild imported its row file
        first) is left as it is; if it holds no row, the row is added as a new trial."""
        if row is not None:
            state, vals = state_of(row)
            trial_id = self.study._storage.get_trial_id_from_study_id_trial_number(
                self.study._study_id, number)
            try:
                for k, v in row_attrs(row).items():
                    self.study._storage.set_trial_user_attr(trial_id, k, v)
            except UpdateFinishedTrialError:
                if row_text_of(self.study._storage.get_trial(trial_id)) is None:
                    self.add_row(row)
                self._live.pop(number, None)
                return
        else:
            state = {Status.OK: TrialState.COMPLETE, Status.PRUNED: TrialState.PRUNED}.get(
                status, TrialState.FAIL)
            vals = list(values) if values is not None else None
        if state is TrialState.COMPLETE and vals is not None:
            self.study.tell(number, values=vals, skip_if_finished=True)
        else:
            self.study.tell(number, state=state if state is not TrialState.COMPLETE
                            else TrialState.FAIL, skip_if_finished=True)
        self._live.pop(number, None)

    def add_row(self, row: dict[str, Any], **attrs: Any) -> int:
        """Record a trial that was never asked for (a skipped layout, a row imported from
        an older results folder) as a finished trial; returns its number. Its ``a2a`` is
        a parameter when the study's distribution of it allows, else only an attribute."""
        state, values = state_of(row)
        dist = self._a2a_distribution()
        params = {"a2a": row["a2a"]} if dist and row["a2a"] in dist.choices else {}
        trial = optuna.trial.create_trial(
            state=state, values=values, params=params,
            distributions={"a2a": dist} if params else {},
            user_attrs={**row_attrs(row), **attrs})
        self.study.add_trial(trial)
        return self.study.get_trials(deepcopy=False)[-1].number

    def _a2a_distribution(self) -> Optional[CategoricalDistribution]:
        """The study's distribution of ``a2a`` (choices must match across its trials): the
        one its trials already use, else ``space``; found once."""
        if self._dist is None:
            for t in self.study.get_trials(deepcopy=False):
                if "a2a" in t.distributions:
                    dist = t.distributions["a2a"]
                    if isinstance(dist, CategoricalDistribution):
                        self._dist = dist
                    break
            else:
                self._dist = CategoricalDistribution(self.space) if self.space else None
        return self._dist

    def pareto_a2a(self) -> set[int]:
        """a2a sizes on the (step time, memory) Pareto front of the completed trials."""
        return {a for t in self.study.best_trials if (a := trial_a2a(t)) is not None}


def _submitted(attrs: dict[str, Any]) -> bool:
    """The trial's job was submitted and the attributes to re-attach to it are all there."""
    return all(k in attrs for k in SUBMISSION)


def trial_a2a(t: FrozenTrial) -> Optional[int]:
    """A trial's a2a size: its parameter, or the attribute a layout outside the study's
    value space carries (``LayoutStudy``)."""
    a2a = t.params.get("a2a", t.user_attrs.get("a2a"))
    return None if a2a is None else int(a2a)


ORCHESTRATOR = f"{socket.gethostname()}:{os.getpid()}"
SUBMISSION = ("executor", "folder", "job_id")  # a submitted trial's attributes
ASK_TRIES = 5  # trials in a row another sweep may end before ``ask`` gives up


def _live_elsewhere(attrs: dict[str, Any]) -> bool:
    """The trial was asked by another sweep on this host that is still running: two users
    sweeping one key into one database leave each other's trials alone. (A sweep on
    another host cannot be checked from here: its trials are adopted, as a killed sweep's
    are, when this sweep resumes the key.)"""
    host, _, pid = str(attrs.get("orchestrator", "")).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pareto_front(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The COMPLETE trials no other COMPLETE trial dominates on (step time, peak memory),
    both minimised: what ``study.best_trials`` returns for these two objectives, in trial
    order, without its deep copy of every trial (whose rows made a rebuild slow) and in
    n log n (sorted by time, a trial is on the front when its memory is below that of every
    strictly faster trial, and the least among the equally fast)."""
    done = sorted((t for t in trials if t.state is TrialState.COMPLETE and t.values),
                  key=lambda t: (t.values[0], t.values[1]))
    front, best_faster, i = [], math.inf, 0
    while i < len(done):
        j = i
        while j < len(done) and done[j].values[0] == done[i].values[0]:
            j += 1
        least = done[i].values[1]  # the least memory at this step time (sorted)
        if least < best_faster:
            front += [t for t in done[i:j] if t.values[1] == least]
        best_faster = min(best_faster, least)
        i = j
    return sorted(front, key=lambda t: t.number)


def pareto_layouts(study: optuna.Study | list[FrozenTrial]) -> list[tuple[int, int]]:
    """``(a2a, p2p)`` layouts on the study's (step time, peak memory) Pareto front
    (``pareto_front``), by a2a. Only trials holding a row count: a trial told before
    rows rode on trials has an imported twin with the same values. A trial whose memory was
    not measured (CPU: its row's peak_mem_bytes is null, told to the study as 0) is left
    out: 0 is no measurement, so it cannot be on a memory front."""
    out = set()
    trials = study if isinstance(study, list) else study.get_trials(deepcopy=False)
    for t in pareto_front(trials):
        text = row_text_of(t)
        if text is None or not isinstance(json.loads(text).get("peak_mem_bytes"), (int, float)):
            continue
        layout = t.user_attrs.get("layout")
        if isinstance(layout, str):
            a2a, p2p = json.loads(layout)
            out.add((int(a2a), int(p2p)))
    return sorted(out)


class Ledger:
    """Every study in one storage (or one ``Journals``), read as the rows its trials hold."""

    def __init__(self, storage: Any) -> None:
        self.storage = open_storage(storage)

    def names(self) -> list[str]:
        if isinstance(self.storage, Journals):
            return self.storage.names()
        return sorted(optuna.get_all_study_names(self.storage))

    def has(self, name: str) -> bool:
        if isinstance(self.storage, Journals):
            return self.storage.name_at(name_slug(name)) == name
        return name in self.names()

    def study(self, name: str) -> optuna.Study:
        return optuna.load_study(study_name=name, storage=storage_for(self.storage, name))

    def rows(self, names: Optional[list[str]] = None) -> dict[tuple[str, str], str]:
        """(study name, trial id) -> row text; of several trials with one id (a layout
        skipped again), the latest. ``names``: the studies (default every one)."""
        out: dict[tuple[str, str], str] = {}
        for name in self.names() if names is None else names:
            trials = self.study(name).get_trials(deepcopy=False)
            self._last = (name, trials)  # ``pareto`` of this study reuses them
            for t in trials:
                text = row_text_of(t)
                if text is not None:
                    out[(name, t.user_attrs["trial_id"])] = text
        return out

    def pareto(self, name: str, names: Optional[Collection[str]] = None) -> str:
        """The study's Pareto front as ``"[1,4] [2,2]"`` ("" without such a study);
        ``names``: the storage's study names when the caller has them (listing them costs
        every study's summary)."""
        if name not in (self.names() if names is None else names):
            return ""
        last = getattr(self, "_last", None)
        trials = last[1] if last and last[0] == name else \
            self.study(name).get_trials(deepcopy=False)
        return " ".join(f"[{a},{p}]" for a, p in pareto_layouts(trials))

    def import_rows(self, name: str, rows: list[dict[str, Any]]) -> int:
        """Put rows the study lacks into it (a results folder written before the study was
        the ledger). A row whose trial is still RUNNING (the orchestrator stopped between
        writing the row and telling) completes that trial; the rest are added, marked
        ``imported``. Idempotent: a trial id the study holds a row for is left alone.
        Returns how many were imported."""
        study = LayoutStudy(self.storage, name, [])
        by_id: dict[str, FrozenTrial] = {}
        for t in study.study.get_trials(deepcopy=False):
            if "trial_id" in t.user_attrs:
                by_id[t.user_attrs["trial_id"]] = t
        n = 0
        for row in rows:
            t = by_id.get(row["trial_id"])
            if t is not None and row_text_of(t) is not None:
                continue
            if t is not None and t.state is TrialState.RUNNING:
                study.tell(t.number, Status(row["status"]), None, row=row)
            else:
                study.add_row(row, imported=True)
            n += 1
        return n
