"""The sides of ``bench.ocr``: rapidocr's own pipeline in this process, one image
at a time, and ``flotilla serve`` under concurrent clients posting ``/v1/ocr``."""
