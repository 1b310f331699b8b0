"""Speculative-decoding draft heads: FR-Spec / EAGLE-3 token maps, training, and a speculative engine."""
__version__ = "0.1.0"
