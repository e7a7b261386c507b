"""Harness stand-in for ``flashinfer.quantization`` (see ``flashinfer/__init__.py``)."""
