"""What Megatron-Core, Transformer Engine and Bridge enforce and compute, as pure functions:
the HCP rules table (``rules``, which orders the checks of ``te``, ``te_packed`` (TE with
packed sequences), ``mcore`` and ``bridge``, each restating one upstream project, over the
parts in ``facts``) and the pipeline schedule's arithmetic (``pipeline``). Imports only the
contract (``spec``, ``errors``); every orchestrator layer may ask it.
"""
