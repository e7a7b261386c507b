"""Harness stand-in for ``flashinfer.trace.templates``: see :mod:`.gdn`."""
