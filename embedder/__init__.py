"""Workers that pull jobs, form their own batches and run models.

Importing this package (or its torch-free modules: ``jobs``, ``errors``,
``fleet``, ``batching``, ``workqueue``) never imports torch; only
``embedder.runtimes.torch_st`` does.
"""
