"""Trace-driven replay of parsl-bft's control loop (the paper's evaluation, on any log)."""
from .replay import SimResult, simulate

__all__ = ["SimResult", "simulate"]
