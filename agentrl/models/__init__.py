"""Models: the named models (the SmolLM2 default), GGUF import, the tiny model, SFT warm start."""

from agentrl.models.tiny import TinyRecipe, ensure_tiny_model
from agentrl.models.tokenizer import build_tokenizer, save_tokenizer

__all__ = ["TinyRecipe", "build_tokenizer", "ensure_tiny_model", "save_tokenizer"]
