"""The engine's greedy output on the embedded SmolLM2 equals transformers' own generate."""

from __future__ import annotations

import torch

from engine import SamplingParams

CHATS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Give me three tips for learning to code.",
    "Translate 'good morning' into Spanish and German.",
    "What is 12 times 7? Answer briefly.",
    "Describe a cat to someone who has never seen one.",
    "Name the planets of the solar system.",
    "Why is the sky blue?",
    "Write a Python function that reverses a string.",
]
MAX_TOKENS = 48


def hf_greedy(hf_model, prompt_ids: list[int], max_tokens: int, eos: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=max_tokens, eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt_ids):].tolist()


def first_divergence_is_near_tie(hf_model, prompt_ids, ours, theirs) -> bool:
    """At the first differing position, do transformers' logits for the two tokens differ by
    less than 1e-4?"""
    k = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b)
    context = torch.tensor([prompt_ids + theirs[:k]])
    with torch.no_grad():
        logits = hf_model(context).logits[0, -1]
    return abs(logits[ours[k]].item() - logits[theirs[k]].item()) < 1e-4


def test_greedy_equals_transformers_for_chat_prompts_submitted_together(smollm2):
    hf_model, tokenizer, llm = smollm2
    prompts = [[{"role": "user", "content": c}] for c in CHATS]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert len(outs) == len(CHATS)
    for out in outs:
        theirs = hf_greedy(hf_model, out.prompt_token_ids, MAX_TOKENS, tokenizer.eos_token_id)
        ours = out.token_ids
        if ours != theirs:
            assert first_divergence_is_near_tie(hf_model, out.prompt_token_ids, ours, theirs), (
                f"diverged from transformers on prompt {out.request_id}")
        assert out.finish_reason == ("stop" if ours[-1] == tokenizer.eos_token_id else "length")
        assert out.text == tokenizer.decode(ours, skip_special_tokens=True)
