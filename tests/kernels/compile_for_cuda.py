"""Compile every Triton kernel, as the launchers call them, to a CUDA binary (sm_90) without a
GPU: the interpreter accepts code that the compiler rejects, so this is the CPU-only guard
against kernels that would only fail on a GPU. Run by test_compile_for_cuda.py in a process
without TRITON_INTERPRET; prints one line per compiled kernel.

Each launcher runs on CPU tensors with JITFunction.run replaced by a compile for the target,
so the argument lists and constexprs are exactly the launchers' own.
"""

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

TARGET = GPUTarget("cuda", 90, 32)
TYPES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.int32: "i32", torch.int64: "i64",
}


def compile_instead_of_run(self, *args, grid, warmup, **kwargs):
    bound = dict(zip(self.arg_names, args, strict=False)) | kwargs
    signature, constexprs = {}, {}
    for param in self.params:
        value = bound[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        else:
            signature[param.name] = "fp32"
    compiled = triton.compile(ASTSource(self, signature, constexprs), target=TARGET)
    print(self.__name__, "shared", compiled.metadata.shared, flush=True)


def main() -> None:
    JITFunction.run = compile_instead_of_run
    from kernels.paged_attention_triton import paged_attention_triton
    from kernels.paged_decode_split_k_triton import paged_decode_split_k_triton
    from kernels.rms_norm_triton import rms_norm_triton
    from kernels.rotary_embedding_triton import rotary_embedding_triton
    from kernels.store_kv_cache_triton import store_kv_cache_triton

    int32 = {"dtype": torch.int32}
    for dtype, head_dim, num_kv_heads, group in [
        (torch.float16, 128, 8, 4),
        (torch.bfloat16, 64, 3, 3),
        (torch.float32, 64, 2, 1),
    ]:
        num_heads = num_kv_heads * group
        k_cache = torch.zeros(8, 16, num_kv_heads, head_dim, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        tables = torch.zeros(2, 4, **int32)
        seq_lens = torch.tensor([5, 9], **int32)
        for q_len in (1, 3):
            q = torch.zeros(2 * q_len, num_heads, head_dim, dtype=dtype)
            starts = torch.tensor([0, q_len, 2 * q_len], **int32)
            paged_attention_triton(
                q, k_cache, v_cache, tables, seq_lens, starts, 0.1,
                max_query_len=q_len, max_seq_len=9, split_k=False,
            )
        paged_decode_split_k_triton(
            torch.zeros(2, num_heads, head_dim, dtype=dtype), k_cache, v_cache, tables,
            seq_lens, torch.tensor([0, 1, 2], **int32), 0.1, num_splits=4,
        )
        key = torch.zeros(3, num_kv_heads, head_dim, dtype=dtype)
        store_kv_cache_triton(key, key, k_cache, v_cache, torch.zeros(3, dtype=torch.int64))
        rotary_embedding_triton(
            torch.zeros(3, dtype=torch.int64), torch.zeros(3, num_heads, head_dim, dtype=dtype),
            key, torch.zeros(10, head_dim),
        )
        x = torch.zeros(3, 576, dtype=dtype)
        rms_norm_triton(x, torch.ones(576, dtype=dtype), 1e-5)
        rms_norm_triton(x, torch.ones(576, dtype=dtype), 1e-5, x)


if __name__ == "__main__":
    main()
