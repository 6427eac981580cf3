"""Model definitions and the architecture registry."""

from engine.models.registry import build_model, supported_architectures

__all__ = ["build_model", "supported_architectures"]
