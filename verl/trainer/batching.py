"""Turn ragged token lists into the padded tensors the workers expect.

Layout (one row per trajectory):
    input_ids = [left-padded prompt | right-padded response]
    response_mask = 1 on response tokens the policy wrote, 0 on environment tokens and padding
"""
from __future__ import annotations

import torch


def pad_trajectories(
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    response_masks: list[list[int]] | None,
    pad_id: int,
    prompt_len: int | None = None,
    response_len: int | None = None,
) -> dict[str, torch.Tensor]:
    """Left-pad prompts and right-pad responses; returns the engine's batch tensors."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if response_masks is None:
        response_masks = [[1] * len(r) for r in response_ids]
    for i, (r, m) in enumerate(zip(response_ids, response_masks)):
        if len(r) != len(m):
            raise ValueError(f"row {i}: response has {len(r)} tokens but its mask has {len(m)}")
    P = prompt_len or max(len(p) for p in prompt_ids)
    R = response_len or max(1, max(len(r) for r in response_ids))
    B = len(prompt_ids)

    prompts = torch.full((B, P), pad_id, dtype=torch.long)  # (batch, prompt_len)
    prompt_attn = torch.zeros(B, P, dtype=torch.long)
    responses = torch.full((B, R), pad_id, dtype=torch.long)  # (batch, response_len)
    response_attn = torch.zeros(B, R, dtype=torch.long)
    response_mask = torch.zeros(B, R, dtype=torch.long)
    for i, (p, r, m) in enumerate(zip(prompt_ids, response_ids, response_masks)):
        if len(p) > P:
            raise ValueError(f"row {i}: prompt of {len(p)} tokens exceeds prompt_len={P}")
        if len(r) > R:
            raise ValueError(f"row {i}: response of {len(r)} tokens exceeds response_len={R}")
        if p:
            prompts[i, P - len(p):] = torch.tensor(p)
            prompt_attn[i, P - len(p):] = 1
        if r:
            responses[i, : len(r)] = torch.tensor(r)
            response_attn[i, : len(r)] = 1
            response_mask[i, : len(r)] = torch.tensor(m)

    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)  # (batch, prompt_len + response_len)
    # Positions count real tokens only, so left padding does not shift the prompt.
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
    }
