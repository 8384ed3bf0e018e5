"""Data loading: one source (sources.py), weighted mixtures (mixture.py), packing (packing.py),
a resumable stream of packed blocks (stream.py), what the CPT (pretraining.py), SFT (sft.py) and
GRPO (grpo.py) recipes train on, built data folders (build.py, manifest.py) and benchmark overlap
(decontamination.py)."""

from medrecipes.data.grpo import grpo_data
from medrecipes.data.manifest import decontamination_summary
from medrecipes.data.mixture import build_mixture
from medrecipes.data.packing import pack_documents
from medrecipes.data.pretraining import pretraining_data
from medrecipes.data.sft import sft_data
from medrecipes.data.sources import load_source
from medrecipes.data.stream import StreamTrainerMixin, TokenStream

__all__ = [
    "StreamTrainerMixin",
    "TokenStream",
    "build_mixture",
    "decontamination_summary",
    "grpo_data",
    "load_source",
    "pack_documents",
    "pretraining_data",
    "sft_data",
]
