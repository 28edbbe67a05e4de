"""embedder.tasks.embed."""
