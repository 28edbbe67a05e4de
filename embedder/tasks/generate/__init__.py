"""Text generation on the pull substrate: a causal LM served with continuous batching.

``runtime`` loads the model (a GGUF file through transformers, dequantized) and its
tokenizer; ``kv`` keeps the running sequences' KV cache as one left-padded batch that
sequences join and leave between steps; ``sampling`` picks each next token; ``text``
turns tokens into text and applies stop strings; ``requests`` and ``replies`` are the
OpenAI bodies in and out; ``engine`` is the loop that pulls generation jobs against a
KV budget and runs one step at a time (iteration-level scheduling). Only ``requests``
and ``replies`` are free of torch.
"""
