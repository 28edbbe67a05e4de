"""The task kinds, one folder each (``embed``, ``rerank``, ``generate``, ``ocr``): its fleet
entry, request and answer codecs, runtimes and engine. ``kind`` is the small descriptor
the host and the gateway know; ``registry`` lists the kinds; ``fleet`` reads the fleet
file by kind."""
