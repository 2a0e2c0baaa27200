"""The sweep engine: the sweep's plan (``sweep_plan``, pure), the run loop (``sweep``, its
collecting half ``sweep_collect`` and records ``sweep_jobs``, ``twostage``), what to measure
again (``sweep_adaptive``, pure), the figures and verdicts (``verdict``, pure), submitit
(``dispatch``, ``launch``), the optuna ledger (``tuner``), the results folder (``store``,
``records``, ``tables``, ``trialrow``, its lock ``folderlock``, a team's database ``rdb``,
``housekeeping``) and the budget estimate (``budget``). Imports the
layers below it, and of the job side only the payload and the steps driver's launch record.
"""
