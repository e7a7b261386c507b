"""Harness stand-in for ``flashinfer.gdn_decode``: the three GDN decode entry points are gdnjit's."""

from gdnjit.gdn import gated_delta_rule_decode, gated_delta_rule_decode_pretranspose, gated_delta_rule_mtp

__all__ = ["gated_delta_rule_decode_pretranspose", "gated_delta_rule_decode", "gated_delta_rule_mtp"]
