"""Stop conditions, finish reasons and incremental text."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.detokenizer import IncrementalDetokenizer


def collect(engine, prompt, params):
    engine.add_request("r", prompt, params)
    pieces, tokens, last = [], [], None
    while engine.has_unfinished_requests():
        for inc in engine.step():
            pieces.append(inc.text)
            tokens += inc.token_ids
            last = inc
    return pieces, tokens, last


def test_text_increments_never_split_a_utf8_character(byte_tokenizer):
    text = "naïve café ☃ 🚀 中文 done"
    ids = byte_tokenizer.encode(text)
    assert len(ids) > len(text) // 2  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(byte_tokenizer, [], False)
    pieces = []
    for token in ids:
        detok.append(token)
        pieces.append(detok.take(finished=False))
    pieces.append(detok.take(finished=True))
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_stop_string_is_cut_and_held_back(byte_tokenizer):
    detok = IncrementalDetokenizer(byte_tokenizer, ["wörld"], include_stop=False)
    pieces = []
    for token in byte_tokenizer.encode("héllo wörld and more"):
        detok.append(token)
        pieces.append(detok.take(finished=detok.stop_reason is not None))
        if detok.stop_reason:
            break
    assert detok.stop_reason == "wörld"
    assert "".join(pieces) == "héllo "
    assert all("w" not in p for p in pieces)  # the stop string's start was never handed out


def test_stop_string_kept_when_asked(byte_tokenizer):
    detok = IncrementalDetokenizer(byte_tokenizer, ["fox"], include_stop=True)
    for token in byte_tokenizer.encode("the quick brown fox jumps"):
        detok.append(token)
        if detok.stop_reason:
            break
    assert detok.take(finished=True) == "the quick brown fox"


def test_engine_stop_string_ends_request_and_is_excluded(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    _, free_tokens, _ = collect(engine, "the lazy", params)
    full = engine.tokenizer.decode(free_tokens)
    stop = full[5:8]  # some text the model will produce
    assert stop.strip()
    pieces, tokens, last = collect(engine, "the lazy",
                                   SamplingParams(temperature=0.0, max_tokens=30,
                                                  ignore_eos=True, stop=[stop]))
    assert last.finish_reason == "stop" and last.stop_reason == stop
    assert "".join(pieces) == full[:full.index(stop)]
    assert tokens == free_tokens[:len(tokens)]


def test_stop_token_id_and_eos_finish_with_stop(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64)
    _, free_tokens, _ = collect(engine, "the quick",
                                SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    target = free_tokens[4]
    _, tokens, last = collect(engine, "the quick", SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[target]))
    assert tokens == free_tokens[:free_tokens.index(target) + 1]
    assert (last.finish_reason, last.stop_reason) == ("stop", target)
    # The same token as EOS stops too, unless ignore_eos.
    engine.eos_token_id = target
    _, tokens, last = collect(engine, "the quick", SamplingParams(temperature=0.0, max_tokens=12))
    assert tokens[-1] == target and last.finish_reason == "stop"
    _, tokens, last = collect(engine, "the quick", SamplingParams(temperature=0.0, max_tokens=12,
                                                                  ignore_eos=True))
    assert len(tokens) == 12 and last.finish_reason == "length"


@pytest.mark.parametrize("bad, field", [
    (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(max_tokens=0),
     "max_tokens"), (dict(n=0), "n"), (dict(stop=[""]), "stop"), (dict(logprobs=99), "logprobs"),
    (dict(min_tokens=5, max_tokens=2), "min_tokens"), (dict(top_k=-2), "top_k"),
])
def test_invalid_sampling_params_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**bad)
