"""embedder.serving."""
