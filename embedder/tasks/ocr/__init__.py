"""OCR on the pull substrate: PP-OCR detection and recognition, batched by the worker.

``api`` is the job's contract (the ``/v1/ocr`` request in, its response out) and the only
module the gateway reads; ``documents`` turns a request into page images or a PDF's own
text; ``detect`` and ``recognize`` are PP-OCR's host-side steps (boxes from the detection
map, line crops, CTC decoding); ``batching`` groups pages and lines into passes;
``layout`` puts lines in reading order; ``runtime`` is the seam the networks run behind
(``onnx``: ONNX Runtime); ``engine`` is the loop that pulls OCR jobs and runs rounds.
"""
