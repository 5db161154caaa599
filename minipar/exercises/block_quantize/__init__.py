"""Exercise: block-wise FP8 (E4M3) quantization with a scale per tile, and back (notebook 12)."""
