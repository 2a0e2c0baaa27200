"""The job side: what runs on every rank of a trial (../shared/DESIGN.md section 2).

Modules here import only the standard library, torch, megatron.core, transformer_engine
(lazily, on the TE path), megatron.bridge (lazily, runner=bridge), submitit (lazily, only
to read a SLURM job's environment), packaging (a Megatron-Core dependency, for TE's
version), ``hcp_tune.spec``, ``hcp_tune.flops`` and ``hcp_tune.noise`` (standard-library
only, shared with the orchestrator) and each
other. Never hydra, optuna, pandas or rich; a test imports
every module with those blocked. This file imports nothing.

  dist.py           where rank/world/master come from; GPU binding; world group with a timeout
  groups.py         Megatron-Core's CP/HCP groups: create, read back, compare, destroy
  ref_attention.py  pure-torch a2a+p2p causal attention with its backward (CPU/fp32)
  te_attention.py   Transformer Engine's DotProductAttention on the same groups (CUDA)
  verify.py         the proof that CP is active: CP result == single-process attention
  bench.py          timing, FLOPs, peak memory
  entry.py          run_trial(spec) on every rank; ``python -m hcp_tune.job.entry``
  bridge_config.py  runner=bridge: the trial as ConfigContainer field paths; the container
  bridge_measure.py the step-recording Bridge callback; Bridge's log lines as fallback
  bridge_verify.py  the CP-active proof read from the model's TE attention modules
  bridge_guard.py   HCPGuard: that proof as a drop-in callback for production runs
  bridge_runner.py  one Bridge trial: stack check, pretrain with the callbacks, result
  payload.py        what a SLURM job unpickles and runs (submitit's payload)
  steps.py          executor.batch=steps: a batch as srun job steps (fresh processes each)
"""
