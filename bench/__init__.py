"""Benchmarks: the engine against SentenceTransformer.encode (``python -m bench.engine``)
and the real server under concurrent clients (``python -m bench.served``), on a
deterministic corpus of real English text (``bench.texts``). See docs/benchmarks/."""
