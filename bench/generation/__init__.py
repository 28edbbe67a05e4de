"""The generation benchmark's parts: the prompts, the streaming client, the
closed-loop load, the in-process transformers server and the flotilla side.
``bench.generate`` runs them."""
