"""Data loading: one source (sources.py), weighted mixtures (mixture.py), packing (packing.py)."""

from medrecipes.data.mixture import build_mixture
from medrecipes.data.packing import pack_documents
from medrecipes.data.pretraining import pretraining_data
from medrecipes.data.sources import load_source

__all__ = ["build_mixture", "load_source", "pack_documents", "pretraining_data"]
