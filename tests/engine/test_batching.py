"""Continuous batching: requests join and leave between steps without changing outputs."""

from __future__ import annotations

import pytest

from engine import LLM, PromptTooLongError, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def run_alone(engine, prompt, params=GREEDY) -> list[int]:
    engine.add_request("solo", prompt, params)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for inc in engine.step():
            tokens += inc.token_ids
    return tokens


def test_request_added_while_others_decode_finishes_correctly(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64)
    prompts = ["the quick brown fox", "jumps over the lazy dog and then", "héllo wörld"]
    expected = [run_alone(engine, p) for p in prompts]

    got: dict[str, list[int]] = {str(i): [] for i in range(3)}
    engine.add_request("0", prompts[0], GREEDY)
    engine.add_request("1", prompts[1], GREEDY)
    for _ in range(5):  # both are decoding by now
        for inc in engine.step():
            got[inc.request_id] += inc.token_ids
    assert engine.scheduler.running and all(r.num_output_tokens for r in engine.scheduler.running)
    engine.add_request("2", prompts[2], GREEDY)
    while engine.has_unfinished_requests():
        for inc in engine.step():
            got[inc.request_id] += inc.token_ids
    assert [got[str(i)] for i in range(3)] == expected


def test_outputs_come_back_in_input_order_with_lengths(tiny_engine):
    engine, _ = tiny_engine("qwen3", num_kv_blocks=64)
    llm = LLM.from_engine(engine)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (3, 9, 1)]
    outs = llm.generate(["a", "bb", "ccc"], params)
    assert [len(o.token_ids) for o in outs] == [3, 9, 1]
    assert all(o.finish_reason == "length" for o in outs)
    assert [o.prompt_token_ids for o in outs] == [engine.tokenize(p) for p in ("a", "bb", "ccc")]


def test_token_budget_and_max_num_seqs_are_respected(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, max_num_batched_tokens=8, max_num_seqs=2)
    for i in range(4):
        engine.add_request(str(i), "the quick brown fox jumps", GREEDY)
    plans = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        plans.append((out.num_batched_tokens, len(engine.scheduler.running)))
        return out

    engine.scheduler.schedule = recording_schedule
    finished = 0
    while engine.has_unfinished_requests():
        finished += sum(inc.finished for inc in engine.step())
    assert finished == 4
    assert max(tokens for tokens, _ in plans) == 8  # long prompts were chunked to the budget
    assert max(running for _, running in plans) == 2


def test_prompt_that_can_never_fit_is_rejected_with_reason(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, max_model_len=32)
    with pytest.raises(PromptTooLongError, match="maximum context length is 32"):
        engine.add_request("long", list(range(40)), GREEDY)
    with pytest.raises(PromptTooLongError, match="30 in the prompt, 24 to generate"):
        engine.add_request("tight", list(range(30)), GREEDY)
    assert not engine.has_unfinished_requests()
    small, _ = tiny_engine("llama", num_kv_blocks=2, block_size=16)
    with pytest.raises(PromptTooLongError, match="KV cache holds at most 32"):
        small.add_request("big", list(range(20)), GREEDY)


def test_abort_reports_abort_and_frees_blocks(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64)
    engine.add_request("x", "the quick brown fox", GREEDY)
    engine.step()
    assert engine.block_manager.num_free_blocks < 64
    assert engine.abort("x")
    (inc,) = engine.step()
    assert (inc.request_id, inc.finished, inc.finish_reason) == ("x", True, "abort")
    assert engine.block_manager.num_free_blocks == 64
    assert not engine.has_unfinished_requests()


def test_generate_with_one_bad_prompt_raises_and_leaves_the_engine_empty(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, max_model_len=32)
    llm = LLM.from_engine(engine)
    with pytest.raises(PromptTooLongError):
        llm.generate(["the quick", list(range(40)), "the lazy"], GREEDY)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == 64
    (out,) = llm.generate(["the quick"], SamplingParams(temperature=0.0, max_tokens=3))
    assert len(out.token_ids) == 3
