"""paged_attention, both impls, against a naive dense causal attention over unpaged K/V.

On CPU, Triton runs through the interpreter (see conftest.py). The interpreter's tl.dot is
wrong for bfloat16, so bfloat16 attention is checked only in test_gpu.py.
"""

import pytest
import torch
from paged_cases import dense_causal_attention, make_paged_batch

import kernels
import kernels.paged_decode_split_k_triton as split_k_module
from kernels.paged_decode_split_k_triton import choose_num_splits, paged_decode_split_k_triton

# (cached prefix, new tokens): decode over several blocks, prefill from zero, chunked prefill
# over a prefix of several blocks, a first decode token, decode right after a block boundary,
# and a prefill long enough to need several query tiles.
MIXED = [(37, 1), (0, 21), (70, 13), (0, 1), (16, 1), (3, 67)]
# All-decode: lengths 1, on and off block boundaries, several blocks.
DECODE = [(0, 1), (31, 1), (63, 1), (100, 1), (15, 1)]
IMPLS = ["triton", "torch"]


def assert_close(out: torch.Tensor, ref: torch.Tensor, atol: float = 2e-3) -> None:
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_mixed_batch_matches_dense_float32(impl, head_dim, group, block_size, device):
    batch = make_paged_batch(
        MIXED, num_kv_heads=2, group=group, head_dim=head_dim, block_size=block_size,
        seed=head_dim + group + block_size, device=device,
    )
    out = kernels.paged_attention(*batch.args(), impl=impl)
    assert out.dtype == torch.float32
    assert_close(out, dense_causal_attention(batch))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("head_dim", "group", "block_size"), [(64, 1, 16), (128, 4, 32), (64, 3, 32)]
)
def test_mixed_batch_matches_dense_float16(impl, head_dim, group, block_size, device):
    batch = make_paged_batch(
        MIXED, num_kv_heads=2, group=group, head_dim=head_dim, block_size=block_size,
        dtype=torch.float16, seed=7, device=device,
    )
    out = kernels.paged_attention(*batch.args(), impl=impl)
    assert out.dtype == torch.float16
    assert_close(out, dense_causal_attention(batch))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("padding", [-1, 10_000])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_all_decode_batch_matches_dense(impl, group, padding, device):
    batch = make_paged_batch(
        DECODE, num_kv_heads=3, group=group, head_dim=64, block_size=16, padding=padding,
        seed=group, device=device,
    )
    out = kernels.paged_attention(*batch.args(), impl=impl, split_k=False)
    assert_close(out, dense_causal_attention(batch))


@pytest.mark.parametrize("impl", IMPLS)
def test_strided_query_view_is_read_correctly(impl, device):
    # The engine slices q out of a fused qkv projection: token stride > num_heads * head_dim.
    batch = make_paged_batch(
        MIXED, num_kv_heads=2, group=2, head_dim=64, block_size=16, device=device
    )
    qkv = torch.randn(batch.q.shape[0], 8, 64, device=device)
    qkv[:, :4] = batch.q
    batch.q = qkv[:, :4]
    assert not batch.q.is_contiguous()
    out = kernels.paged_attention(*batch.args(), impl=impl)
    assert_close(out, dense_causal_attention(batch))


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_batch_returns_empty_output(impl, device):
    batch = make_paged_batch(
        [(5, 1)], num_kv_heads=1, group=2, head_dim=64, block_size=16, device=device
    )
    out = kernels.paged_attention(
        batch.q[:0], batch.k_cache, batch.v_cache, batch.block_tables[:0], batch.seq_lens[:0],
        batch.query_start_loc[:1], batch.scale, impl=impl,
    )
    assert out.shape == (0, 2, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 4])
def test_forced_split_k_matches_dense(group, dtype, device):
    batch = make_paged_batch(
        DECODE, num_kv_heads=2, group=group, head_dim=128, block_size=32, dtype=dtype,
        seed=group, device=device,
    )
    out = kernels.paged_attention(*batch.args(), impl="triton", split_k=True)
    assert_close(out, dense_causal_attention(batch))


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_split_k_with_empty_splits_matches_dense(num_splits, device):
    # With 8 splits of whole 64-key tiles, the short contexts leave most splits empty.
    batch = make_paged_batch(
        DECODE + [(300, 1)], num_kv_heads=2, group=3, head_dim=64, block_size=16, seed=3,
        device=device,
    )
    out = paged_decode_split_k_triton(*batch.args(), num_splits=num_splits)
    assert_close(out, dense_causal_attention(batch))


def test_split_k_is_chosen_only_for_few_long_decodes():
    assert choose_num_splits(num_seqs=2, num_kv_heads=2, max_seq_len=8192) > 1
    assert choose_num_splits(num_seqs=2, num_kv_heads=2, max_seq_len=200) == 1
    assert choose_num_splits(num_seqs=256, num_kv_heads=8, max_seq_len=8192) == 1


def test_launcher_takes_split_k_path_by_itself_for_long_decode(monkeypatch, device):
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs["num_splits"])
        return paged_decode_split_k_triton(*args, **kwargs)

    monkeypatch.setattr(split_k_module, "paged_decode_split_k_triton", spy)
    long_decode = make_paged_batch(
        [(1100, 1)], num_kv_heads=1, group=2, head_dim=64, block_size=32, seed=5, device=device
    )
    out = kernels.paged_attention(*long_decode.args(), impl="triton")
    assert calls and calls[0] > 1
    assert_close(out, dense_causal_attention(long_decode))

    calls.clear()
    mixed = make_paged_batch(
        [(1100, 1), (0, 3)], num_kv_heads=1, group=2, head_dim=64, block_size=32, device=device
    )
    kernels.paged_attention(*mixed.args(), impl="triton")
    assert calls == []


def test_split_k_refuses_a_batch_with_prefill(device):
    batch = make_paged_batch(
        MIXED, num_kv_heads=1, group=2, head_dim=64, block_size=16, device=device
    )
    with pytest.raises(ValueError, match="all-decode"):
        kernels.paged_attention(*batch.args(), impl="triton", split_k=True)


def test_hints_give_the_same_result_as_computed_maxima(device):
    batch = make_paged_batch(
        MIXED, num_kv_heads=2, group=2, head_dim=64, block_size=16, device=device
    )
    plain = kernels.paged_attention(*batch.args(), impl="triton")
    hinted = kernels.paged_attention(
        *batch.args(), impl="triton", max_query_len=67, max_seq_len=83
    )
    torch.testing.assert_close(plain, hinted, atol=0, rtol=0)
