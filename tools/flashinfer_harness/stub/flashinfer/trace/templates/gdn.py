"""Harness stand-in for ``flashinfer.trace.templates.gdn``: ``gdn_replayssm_commit_trace.init(...)`` returns valid
keyword arguments for ``gated_delta_rule_replayssm_commit`` in FlashInfer 0.7.2.post1's documented layouts (its
docstring: fp32 ``[layers, slots, HV, 128, 128]`` checkpoints, bf16 raw v / k windows ``[layers, slots, HV|H, T,
128]``, fp32 log decay / beta ``[layers, slots, HV, T]``, int32 ``[B]`` slots and accepted lengths). The shapes and
values are this harness's own choice (FlashInfer's trace module is not copied): 2 layers, H = 2, HV = 8, T = 8,
distinct live slots, accepted lengths 1..T, every tensor freshly allocated (16-byte aligned)."""

from __future__ import annotations

import torch


class _CommitTrace:
    """The ReplaySSM commit's input builder (FlashInfer's trace templates expose ``init``)."""

    layers, heads, value_heads, steps, dim = 2, 2, 8, 8, 128

    def init(self, *, batch_size: int = 4, device: str = "cuda", seed: int = 0) -> dict:
        g = torch.Generator(device=device).manual_seed(seed)
        L, H, HV, T, D = self.layers, self.heads, self.value_heads, self.steps, self.dim
        slots = batch_size + 3

        def rand(*shape, dtype=torch.float32, scale=0.1):
            return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

        order = torch.randperm(slots - 1, generator=g, device=device)[:batch_size] + 1  # distinct, slot 0 unused
        return dict(
            checkpoint_state=rand(L, slots, HV, D, D),
            rawv_cache=rand(L, slots, HV, T, D, dtype=torch.bfloat16),
            rawk_cache=rand(L, slots, H, T, D, dtype=torch.bfloat16),
            g_cache=-torch.rand(L, slots, HV, T, generator=g, device=device) * 0.5,
            beta_cache=torch.rand(L, slots, HV, T, generator=g, device=device),
            state_indices=order.to(torch.int32),
            accept_lens=torch.randint(1, T + 1, (batch_size,), generator=g, device=device, dtype=torch.int32),
        )


gdn_replayssm_commit_trace = _CommitTrace()
