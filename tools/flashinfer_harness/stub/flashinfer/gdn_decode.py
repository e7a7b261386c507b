"""Harness stand-in for ``flashinfer.gdn_decode``: the GDN decode entry points and ReplaySSM's commit are gdnjit's."""

from gdnjit.gdn import gated_delta_rule_decode, gated_delta_rule_decode_pretranspose, gated_delta_rule_mtp
from gdnjit.replay import gated_delta_rule_replayssm_commit

__all__ = ["gated_delta_rule_decode_pretranspose", "gated_delta_rule_decode", "gated_delta_rule_mtp",
           "gated_delta_rule_replayssm_commit"]
