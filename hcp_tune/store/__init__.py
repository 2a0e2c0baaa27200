"""The results store: what a sweep measured, kept where the sweep loop writes it and every
command reads it. ``folder`` (``ResultStore``: a results folder's row files, ledger and
tables), ``studies`` (the ledger: one optuna study per sweep key, each finished trial
holding its whole row), ``journals`` (where the studies live: a journal file per key,
or one database), ``records`` (the key and row schema), ``trialrow`` (a result as a
row), ``tables`` (trials.csv and recommendations.csv, ranked by ``hcp_tune.stats``),
``folderlock`` (the folder's lock), ``rdb`` (a team's database) and ``housekeeping``
(drop, archive, migrate). It imports the layers below it (the contract, the ranking's
statistics, the cost model's token rate) and nothing of the engine, which reads and writes
it like the outputs do.
"""
