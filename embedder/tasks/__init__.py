"""embedder.tasks."""
