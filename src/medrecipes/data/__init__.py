"""Data loading: one source (sources.py), weighted mixtures (mixture.py), packing (packing.py),
and what the CPT (pretraining.py), SFT (sft.py) and GRPO (grpo.py) recipes train on."""

from medrecipes.data.grpo import grpo_data
from medrecipes.data.mixture import build_mixture
from medrecipes.data.packing import pack_documents
from medrecipes.data.pretraining import pretraining_data
from medrecipes.data.sft import sft_data
from medrecipes.data.sources import load_source

__all__ = ["build_mixture", "grpo_data", "load_source", "pack_documents", "pretraining_data", "sft_data"]
