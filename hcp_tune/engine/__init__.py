"""The sweep engine: the sweep's plan (``sweep_plan``, pure), the run loop (``sweep``, its
collecting half ``sweep_collect`` and records ``sweep_jobs``, ``twostage``), what to measure
again (``sweep_adaptive``, pure), submitit (``dispatch``, ``launch``, ``pools``), the budget
estimate (``budget``) and the synthetic runner (``synthetic``). It reads and writes the
results store (``hcp_tune.store``) and ranks with ``hcp_tune.stats``; imports the layers
below it, and of the job side only the payload and the steps driver's launch record.
"""
