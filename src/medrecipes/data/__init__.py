"""Data loading: one source (sources.py), weighted mixtures (mixture.py), packing (packing.py),
a resumable stream of packed blocks (stream.py), what the CPT (pretraining.py), SFT (sft.py) and
GRPO (grpo.py) recipes train on, built data folders (build.py, manifest.py) and benchmark overlap
(decontamination.py).

Import each from its module (`from medrecipes.data.sft import sft_data`): the package imports
none of them itself, so that reading one source (the benchmark tasks do) does not load the
pretraining stream, the mixtures and the build code.
"""
