"""embedder.core."""
