"""The optuna side of a sweep: one study per sweep key, all kept layouts enqueued.

The layout space is small (the divisors of CP), so every kept layout is measured: each is
enqueued and asked for in order (best-predicted first when the cost model ordered them).
Two objectives, step time and peak memory, both minimised. The study lives in a journal
file under ``results/`` (safe on a cluster's shared file system), or in any optuna storage
URL. Which trials are finished is judged by the result store's rows, not by optuna's
state, so a cancelled or never-submitted trial is simply asked again on resume.
This is the one module that imports optuna.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import optuna

from hcp_tune.spec import Status

optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_storage(url_or_path: str) -> Any:
    """An RDB URL (``sqlite:///x.db``, ``postgresql://...``) or a journal file path."""
    if "://" in url_or_path:
        return url_or_path
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    Path(url_or_path).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(url_or_path)))


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
    """Ask/tell over the kept a2a sizes of one sweep key."""

    def __init__(self, storage: Any, name: str, kept_a2a: list[int]) -> None:
        self.kept = list(kept_a2a)
        self.study = optuna.create_study(
            storage=storage, study_name=name, directions=["minimize", "minimize"],
            load_if_exists=True,
        )
        self._live: dict[int, optuna.Trial] = {}

    def outstanding(self, stored_ids: set[str]) -> list[Outstanding]:
        """Submitted trials whose result was never stored: re-attach to them."""
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            attrs = t.user_attrs
            if "job_id" in attrs and attrs["trial_id"] not in stored_ids:
                out.append(Outstanding(t.number, int(t.params["a2a"]), attrs["trial_id"],
                                       attrs["job_id"], attrs["executor"], attrs["folder"]))
        return out

    def abandon_unsubmitted(self) -> None:
        """Trials asked for but never submitted (killed in between) end as FAIL."""
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if "job_id" not in t.user_attrs:
                self.study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)

    def ask(self, a2a: int, trial_id_prefix: str) -> tuple[int, str, int]:
        """Start a trial for layout ``a2a``; returns (trial number, trial id, a2a it got)."""
        self.study.enqueue_trial({"a2a": a2a})
        trial = self.study.ask()
        got = trial.suggest_categorical("a2a", self.kept)
        if got != a2a:  # another orchestrator took our enqueued trial: measure what we got
            a2a = got
        trial_id = f"{trial_id_prefix}-t{trial.number:03d}-a{a2a}"
        trial.set_user_attr("trial_id", trial_id)
        self._live[trial.number] = trial
        return trial.number, trial_id, a2a

    def submitted(self, number: int, job_id: str, executor: str, folder: str) -> None:
        trial = self._live[number]
        for k, v in (("job_id", job_id), ("executor", executor), ("folder", folder)):
            trial.set_user_attr(k, v)

    def not_run(self, number: int) -> None:
        """A submitted trial its batch job never ran: FAIL, marked so (it is asked again)."""
        trial = self._live.get(number)
        if trial is not None:  # (a re-attached trial has no live handle: FAIL says enough)
            trial.set_user_attr("not_run", True)
        self.study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        self._live.pop(number, None)

    def tell(self, number: int, status: Status, values: Optional[tuple[float, float]]) -> None:
        state = {
            Status.OK: optuna.trial.TrialState.COMPLETE,
            Status.PRUNED: optuna.trial.TrialState.PRUNED,
        }.get(status, optuna.trial.TrialState.FAIL)
        if state is optuna.trial.TrialState.COMPLETE and values is not None:
            self.study.tell(number, values=list(values), skip_if_finished=True)
        else:
            self.study.tell(number, state=state, skip_if_finished=True)
        self._live.pop(number, None)

    def pareto_a2a(self) -> set[int]:
        """a2a sizes on the (step time, memory) Pareto front of the completed trials."""
        return {int(t.params["a2a"]) for t in self.study.best_trials}
