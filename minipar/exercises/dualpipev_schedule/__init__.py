"""Exercise: DeepSeek-V3's DualPipe-V pipeline schedule (two chunks in a V, overlapped pairs)."""
