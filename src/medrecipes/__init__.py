"""medrecipes: training recipes for medical language models on the Hugging Face stack."""

__version__ = "0.1.0"
