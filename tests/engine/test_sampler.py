"""The sampler: each logits transform against a direct per-element computation, and seeded
draws that do not depend on the batch."""

from __future__ import annotations

import math

import torch

from engine import LLM, SamplingParams
from engine.detokenizer import IncrementalDetokenizer
from engine.sampler import apply_min_tokens, apply_penalties, apply_top_k_top_p_min_p
from engine.sequence import Request

VOCAB = 40
EOS = 0


def make_request(prompt: list[int], output: list[int], **params) -> Request:
    req = Request("r", prompt, SamplingParams(max_tokens=64, **params),
                  IncrementalDetokenizer(None, [], False), EOS, 64)
    for token in output:
        req.append_token(token)
    return req


def random_logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


# Prompt and output ids overlap in 5; the output repeats 7 three times.
PROMPT, OUTPUT = [1, 2, 3, 5], [5, 7, 7, 9, 7]


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = random_logits(2, seed=1)
    reqs = [make_request(PROMPT, OUTPUT, repetition_penalty=1.7), make_request(PROMPT, OUTPUT)]
    got = apply_penalties(logits, reqs)
    expected = logits.clone()
    for t in set(PROMPT) | set(OUTPUT):
        x = logits[0, t].item()
        expected[0, t] = x / 1.7 if x > 0 else x * 1.7
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_frequency_penalty_subtracts_per_output_occurrence():
    logits = random_logits(2, seed=2)
    reqs = [make_request(PROMPT, OUTPUT, frequency_penalty=0.6), make_request(PROMPT, OUTPUT)]
    got = apply_penalties(logits, reqs)
    expected = logits.clone()
    for t in range(VOCAB):
        expected[0, t] -= 0.6 * OUTPUT.count(t)  # prompt tokens are not counted
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_presence_penalty_subtracts_once_per_output_token():
    logits = random_logits(2, seed=3)
    reqs = [make_request(PROMPT, OUTPUT, presence_penalty=-1.1), make_request(PROMPT, [])]
    got = apply_penalties(logits, reqs)
    expected = logits.clone()
    for t in set(OUTPUT):
        expected[0, t] -= -1.1
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_penalties_combine_repetition_first_then_frequency_and_presence():
    logits = random_logits(1, seed=4)
    req = make_request(PROMPT, OUTPUT, repetition_penalty=1.3, frequency_penalty=0.5,
                       presence_penalty=0.25)
    got = apply_penalties(logits, [req])
    expected = logits.clone()
    for t in range(VOCAB):
        x = logits[0, t].item()
        if t in PROMPT or t in OUTPUT:
            x = x / 1.3 if x > 0 else x * 1.3
        expected[0, t] = x - 0.5 * OUTPUT.count(t) - 0.25 * (t in OUTPUT)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def kept(row: torch.Tensor) -> set[int]:
    return {i for i, x in enumerate(row.tolist()) if x != -math.inf}


def test_top_k_keeps_the_k_largest_logits():
    logits = random_logits(3, seed=5)
    got = apply_top_k_top_p_min_p(logits, [5, 0, 1], [1.0] * 3, [0.0] * 3)
    assert kept(got[0]) == set(logits[0].argsort(descending=True)[:5].tolist())
    assert torch.equal(got[1], logits[1])  # 0 disables it
    assert kept(got[2]) == {logits[2].argmax().item()}
    assert torch.equal(got[0][list(kept(got[0]))], logits[0][list(kept(got[0]))])


def test_top_p_keeps_the_smallest_head_reaching_p():
    logits = random_logits(3, seed=6)
    top_p = [0.5, 0.9, 1.0]
    got = apply_top_k_top_p_min_p(logits, [0] * 3, top_p, [0.0] * 3)
    for row, p in enumerate(top_p):
        probs = logits[row].softmax(dim=0).tolist()
        order = sorted(range(VOCAB), key=lambda t: -probs[t])
        expected, mass = set(), 0.0
        for t in order:  # take tokens, most likely first, until their mass reaches p
            if mass >= p:
                break
            expected.add(t)
            mass += probs[t]
        assert kept(got[row]) == expected, row
    assert len(kept(got[1])) in range(2, VOCAB) and len(kept(got[2])) == VOCAB  # a real cut


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    logits = random_logits(3, seed=7)
    min_p = [0.1, 0.3, 0.0]
    got = apply_top_k_top_p_min_p(logits, [0] * 3, [1.0] * 3, min_p)
    for row, m in enumerate(min_p):
        probs = logits[row].softmax(dim=0)
        expected = {t for t in range(VOCAB) if probs[t] >= m * probs.max()}
        assert kept(got[row]) == expected, row
    assert len(kept(got[0])) in range(2, VOCAB) and len(kept(got[2])) == VOCAB  # a real cut


def test_min_tokens_masks_eos_and_stop_token_ids_until_reached():
    logits = random_logits(4, seed=8)
    reqs = [
        make_request(PROMPT, [5, 6], min_tokens=3, stop_token_ids=[11, 12]),
        make_request(PROMPT, [5, 6], min_tokens=3, stop_token_ids=[11], ignore_eos=True),
        make_request(PROMPT, [5, 6, 7], min_tokens=3, stop_token_ids=[11]),  # reached
        make_request(PROMPT, [5], stop_token_ids=[11]),
    ]
    got = apply_min_tokens(logits, reqs)
    expected = logits.clone()
    expected[0, [EOS, 11, 12]] = -math.inf
    expected[1, 11] = -math.inf
    assert torch.equal(got, expected)


def generate(engine, prompts, params) -> list[list[int]]:
    return [o.token_ids for o in LLM.from_engine(engine).generate(prompts, params)]


def test_min_tokens_keeps_a_stop_token_from_ending_the_output_early(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64)
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    (first, *_), = generate(engine, ["the quick brown fox"], greedy)
    stop_early = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                                stop_token_ids=[first])
    assert generate(engine, ["the quick brown fox"], stop_early) == [[first]]
    held = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                          stop_token_ids=[first], min_tokens=3)
    (tokens,) = generate(engine, ["the quick brown fox"], held)
    assert len(tokens) >= 3 and first not in tokens[:3]


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64)
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    (alone,) = generate(engine, ["jumps over"], seeded)
    others = SamplingParams(temperature=1.0, max_tokens=9, ignore_eos=True)
    batch = generate(engine, ["héllo", "jumps over", "the lazy dog", "fox"],
                     [others, seeded, others, others])
    assert batch[1] == alone
    unseeded = SamplingParams(temperature=1.0, seed=4321, max_tokens=16, ignore_eos=True)
    assert generate(engine, ["jumps over"], unseeded)[0] != alone  # the seed matters


def test_top_k_1_equals_greedy(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64)
    prompts = ["the quick brown fox", "héllo wörld"]
    greedy = generate(engine, prompts, SamplingParams(temperature=0.0, max_tokens=12,
                                                     ignore_eos=True))
    top_1 = generate(engine, prompts, SamplingParams(temperature=1.5, top_k=1, max_tokens=12,
                                                    ignore_eos=True))
    assert top_1 == greedy


def test_argmax_takes_the_first_of_tied_maxima_as_torch_argmax():
    from engine.sampler import argmax

    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 4, (16, 49152), generator=gen).float()  # ties everywhere
    logits[3] = float("-inf")
    logits[3, 7] = 0.0
    assert torch.equal(argmax(logits), logits.argmax(dim=1))
    assert argmax(logits)[0] == (logits[0] == 3).nonzero()[0, 0]
