"""hcp-tune: choose Megatron-Bridge's hierarchical context-parallel layout by measurement.

This package file imports nothing heavy: the job side (``hcp_tune.job``) and the
orchestrator side share it, and neither may pay for the other's imports.
"""
__version__ = "0.1.0"
