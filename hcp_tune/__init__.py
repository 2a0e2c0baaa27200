"""hcp-tune: choose Megatron-Bridge's hierarchical context-parallel layout by measurement.

The orchestrator's packages, in the order data flows (each imports only the ones above it
in this list, and the contract):

  upstream/   what Megatron-Core, TE and Bridge enforce and compute: the HCP rules table,
              the pipeline schedule's arithmetic
  config/     the one loader (Hydra compose -> typed ``SweepConfig``), cluster and model
              profiles, the typed groups, Bridge's recipes
  space/      the layout space: layouts and rank groups, validate, plan
  costmodel/  predicted step time and memory: formulas, calibration, agreement with
              published tables, the predicted ranking, the memory fit advice
  stats/      the ranking's statistics: figures, verdicts, the moderated spreads (pure)
  store/      the results store: the ledger (optuna studies), row files, the tables, the
              folder's lock, a team's database, housekeeping
  engine/     the sweep: its plan (pure), dispatch (submitit), what to measure again, the
              budget estimate, two-stage sweeps
  outputs/    terminal tables, recommend, report, regress, HTML and SVG
  cli.py, gpucheck/   the commands, on top

The job side (``job/``: what runs on every rank) imports nothing of the orchestrator but
the contract: ``spec``, ``errors``, ``noise``, ``flops`` and ``merge`` (standard library
only, this folder's top level). tests/test_house.py checks both directions and that no
import cycle exists. This file imports nothing heavy: both sides share it.
"""
__version__ = "0.1.0"
