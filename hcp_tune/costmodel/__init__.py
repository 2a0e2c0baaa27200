"""Predicted step time and memory of a layout: the formulas (``formulas``), their calibration
on measured rows (``calibrate``), agreement with published tables (``agreement``), the
predicted ranking the ``predict`` command prints (``predict``) and the advice that makes a
layout fit in memory (``memory``). Imports ``space``, ``config``, ``upstream``, the contract.
"""
