"""n > 1 samples share one prefill and the prompt's blocks; logprobs match the model's."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Request


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPT = random_ids(40, seed=1)  # two full blocks and a partial one


def test_n_3_returns_three_outputs_from_one_prefill(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    (out,) = LLM.from_engine(engine).generate([PROMPT], params)
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert [len(o.token_ids) for o in out.outputs] == [10, 10, 10]
    assert len({tuple(o.token_ids) for o in out.outputs}) == 3  # each its own seed
    assert engine.stats()["prompt_tokens_computed"] == len(PROMPT)
    assert engine.stats()["kv_blocks_free"] == 64

    (again,) = LLM.from_engine(engine).generate([PROMPT], params)
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]


def test_n_children_share_prompt_blocks_and_copy_the_partial_one_on_write(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    engine.add_request("r", PROMPT, SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=4,
                                                   ignore_eos=True))
    engine.step()  # the prefill, then the fork
    children = engine.requests["r"]
    tables = [c.block_table for c in children]
    assert tables[0] == tables[1] == tables[2] and len(tables[0]) == 3
    assert [engine.block_manager.blocks[b].ref_cnt for b in tables[0]] == [3, 3, 3]
    assert engine.stats()["kv_blocks_used"] == 3

    engine.step()  # each writes its first token into block 2: two copy it, the last keeps it
    full, last = {tuple(c.block_table[:2]) for c in children}, {c.block_table[2] for c in children}
    assert len(full) == 1 and len(last) == 3
    assert [engine.block_manager.blocks[b].ref_cnt for b in tables[0][:2]] == [3, 3]
    assert engine.stats()["kv_blocks_used"] == 5


def test_n_2_greedy_outputs_are_identical_and_equal_n_1(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    llm = LLM.from_engine(engine)
    one = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    two = SamplingParams(n=2, temperature=0.0, max_tokens=12, ignore_eos=True)
    (expected,) = llm.generate([PROMPT], one)
    (out,) = llm.generate([PROMPT], two)
    assert [o.token_ids for o in out.outputs] == [expected.token_ids] * 2


def test_logprobs_are_the_models_log_softmax_with_sorted_top_alternatives(tiny_engine):
    engine, hf_model = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    prompt = random_ids(21, seed=2)
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3),
              SamplingParams(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True,
                             logprobs=3)]
    for out in LLM.from_engine(engine).generate([prompt, prompt], params):
        tokens = out.token_ids
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + tokens])).logits[0].float()
        expected = logits[len(prompt) - 1:-1].log_softmax(dim=-1)  # the rows that chose them
        assert len(out.outputs[0].logprobs) == len(tokens) == 6
        for row, token, entry in zip(expected, tokens, out.outputs[0].logprobs, strict=True):
            assert entry.token_id == token
            assert abs(entry.logprob - row[token].item()) < 1e-4
            top_vals, top_ids = row.topk(3)
            assert [t for t, _, _ in entry.top_logprobs] == top_ids.tolist()
            values = [lp for _, _, lp in entry.top_logprobs]
            assert values == sorted(values, reverse=True)
            torch.testing.assert_close(torch.tensor(values), top_vals, rtol=0, atol=1e-4)
            assert entry.top_logprobs[0][1] == engine.tokenizer.decode([top_ids[0].item()])


def test_logprobs_0_returns_only_the_chosen_token(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=0)
    (out,) = LLM.from_engine(engine).generate([PROMPT], params)
    assert [e.top_logprobs for e in out.outputs[0].logprobs] == [[], [], []]
    assert all(e.logprob <= 0.0 for e in out.outputs[0].logprobs)


def test_n_samples_count_against_max_num_seqs(tiny_engine):
    prompts = [random_ids(20 + 7 * i, seed=10 + i) for i in range(3)]
    params = [SamplingParams(n=3, temperature=1.0, seed=11 + i, max_tokens=12, ignore_eos=True)
              for i in range(3)]
    roomy, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    expected = [[o.token_ids for o in out.outputs]
                for out in LLM.from_engine(roomy).generate(prompts, params)]

    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16, max_num_seqs=4)
    running = []
    step = engine.step

    def recording_step():
        increments = step()
        running.append(len(engine.scheduler.running))
        return increments

    engine.step = recording_step
    outs = LLM.from_engine(engine).generate(prompts, params)
    assert [[o.token_ids for o in out.outputs] for out in outs] == expected
    assert max(running) == 3  # a second n=3 request would need 6 seats
    with pytest.raises(ValueError, match="n must be at most max_num_seqs"):
        engine.add_request("wide", prompts[0], SamplingParams(n=5))


def test_n_samples_under_memory_pressure_match_unconstrained(tiny_engine):
    prompts = [random_ids(20 + 7 * i, seed=10 + i) for i in range(3)]
    params = [SamplingParams(n=3, temperature=1.0, seed=11 + i, max_tokens=30, ignore_eos=True)
              for i in range(3)]
    roomy, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    expected = [[o.token_ids for o in out.outputs]
                for out in LLM.from_engine(roomy).generate(prompts, params)]
    tight, _ = tiny_engine("llama", num_kv_blocks=12, block_size=16)
    outs = LLM.from_engine(tight).generate(prompts, params)
    assert [[o.token_ids for o in out.outputs] for out in outs] == expected
    assert tight.stats()["num_preemptions"] > 0
    assert tight.stats()["kv_blocks_free"] == 12


def test_copy_on_write_into_a_block_freed_before_the_forward_is_dropped():
    def request() -> Request:
        return Request("r", PROMPT, SamplingParams(), IncrementalDetokenizer(None, [], False),
                       None, 8)

    bm = BlockManager(num_blocks=8, block_size=16)
    parent, child = request(), request()
    assert bm.allocate(parent, len(PROMPT))
    parent.num_computed_tokens = child.num_computed_tokens = len(PROMPT)
    bm.fork(parent, child)
    for req in (parent, child):
        req.append_token(5)
    assert bm.allocate(parent, 1)  # parent copies the shared partial block
    (copy,) = bm.pending_copies
    assert copy == (child.block_table[2], parent.block_table[2])
    bm.free(parent)  # preempted in the same step: a later copy could land in that block
    assert bm.pending_copies == []
    assert bm.blocks[child.block_table[2]].ref_cnt == 1
