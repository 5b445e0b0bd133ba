"""mlxspec: speculative decoding for local LLMs on MLX."""

from . import runtime  # noqa: F401  (must run before anything imports mlx)

__version__ = "0.1.0"
