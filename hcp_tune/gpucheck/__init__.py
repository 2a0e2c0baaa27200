"""The GPU check anyone can run (``scripts/gpu_check.sh``, ``python -m hcp_tune.gpucheck``):
``attention`` (TE or the torch reference at cp=4), ``bridge`` (two short Bridge runs) and
``__main__`` (the command). It sits beside the CLI, on top: it may import any layer of the
orchestrator and starts jobs through ``engine.launch``.
"""
