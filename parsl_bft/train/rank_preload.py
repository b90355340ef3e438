"""Imported once by the forkserver that training ranks fork from (see fragment._rank_context), so every rank
starts with this already done: torch, the fragment code and its launcher, and torch's lazy imports behind
``use_deterministic_algorithms`` (about 800 modules, a second per rank otherwise)."""
import importlib

import torch

importlib.import_module("parsl_bft.train.launcher")
torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled())
