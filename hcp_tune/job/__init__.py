"""The job side: what runs on every rank of a trial (docs: the orchestrator/job boundary).

Modules here import only the standard library, torch, megatron.core, transformer_engine
(lazily, on the TE path), megatron.bridge (lazily, runner=bridge), submitit (lazily, only
to read a SLURM job's environment), packaging (a Megatron-Core dependency, for TE's
version), ``hcp_tune.spec``, ``hcp_tune.flops``, ``hcp_tune.noise``, ``hcp_tune.merge`` and
``hcp_tune.packing`` (standard-library only, shared with the orchestrator) and each other.
Never hydra, optuna, pandas or rich; a test imports every module with those blocked. This
file imports nothing.

  dist.py           where rank/world/master come from; GPU binding; world group with a timeout
  groups.py         Megatron-Core's CP/HCP groups: create, read back, compare, destroy
  backend.py        TE or the torch reference for this rank; the environment fingerprint
  failures.py       an exception -> failure class; the faults tests may inject
  progress.py       the progress lines a trial appends; the stop file it reads
  bench.py          timing, FLOPs, peak memory
  trial.py          run_trial(spec) on every rank: one attention trial, end to end
  batch.py          run_batch: a job's trials in the same processes; a hung peer's end
  entry.py          ``python -m hcp_tune.job.entry`` by hand
  payload.py        what a SLURM job unpickles and runs (submitit's payload)
  steps.py          executor.batch=steps: a batch as srun job steps (fresh processes each)
  knobs.py          the communication settings recorded, the injected delay (tests)
  attention/        TE and the torch reference, the numerics proof; packed sequences (THD)
  bridge/           runner=bridge: config, step recorder, CP proof, HCPGuard, the run
"""
