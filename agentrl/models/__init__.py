"""The tiny default model: tokenizer, synthetic demonstrations, SFT warm start, cache."""

from agentrl.models.tiny import TinyRecipe, ensure_tiny_model
from agentrl.models.tokenizer import build_tokenizer, save_tokenizer

__all__ = ["TinyRecipe", "build_tokenizer", "ensure_tiny_model", "save_tokenizer"]
