"""Drop-in entry points with serving engines' signatures, running gdnjit's kernels.

- :mod:`gdnjit.compat.vllm`: vLLM's ``fused_sigmoid_gating_delta_rule_update``, ``fused_recurrent_gated_delta_rule``
  and ``causal_conv1d_update``;
- :mod:`gdnjit.compat.sglang`: SGLang's ``fused_sigmoid_gating_delta_rule_update`` (verify buffers, EAGLE trees).

Each validates, maps the engine's arguments onto :func:`gdnjit.gdn_engine.engine_step` (one kernel launch, no
loop over requests, no device read: graph capturable) and is registered as a torch custom op
(:mod:`gdnjit.torch_ops`). docs/api.md lists where they differ from the engines' kernels and why.
"""
