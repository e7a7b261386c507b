"""Harness stand-in for ``flashinfer.trace`` (FlashInfer's test-data module): only the input builders the ReplaySSM
tests call (:mod:`.templates.gdn`). Written for this harness; not FlashInfer's code."""
