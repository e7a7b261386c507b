"""Exact torch reference implementations that kernels are tested against."""
