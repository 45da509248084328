"""Test support: where the real services come from, and per-module isolation on them."""
