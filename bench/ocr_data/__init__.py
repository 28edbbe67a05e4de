"""The OCR accuracy set: fonts from Debian's archive, known text rendered into
page images with their ground truth, and the character error rate."""
