"""Domain LoRA adapters: data (``gesetze``, ``pairs``, ``dataset``), training
(``negatives``, ``train``, ``callbacks``, ``progress``, ``config``, ``manifest``,
``cost``) and retrieval evaluation
(``metrics``, ``bm25``, ``evaluate``). ``flotilla lora`` and ``flotilla eval`` wire them."""
