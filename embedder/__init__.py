"""Workers that pull jobs, form their own batches and run models.

Importing this package (or its torch-free modules: ``jobs``, ``errors``,
``fleet``, ``batching``, ``lifecycle``, and the ``queue`` package with every
substrate in it) never imports torch; only ``embedder.tasks.embed.runtimes.torch_st`` does.
``embedder.queue`` and ``embedder.queue.inprocess`` import no broker client
either; ``embedder.queue.jetstream``'s client modules import nats.
"""
