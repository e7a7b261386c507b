"""The package version (part of every cache key)."""

__version__ = "0.1.0"
