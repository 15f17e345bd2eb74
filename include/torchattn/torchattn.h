#pragma once

/// torchattn: the attention modules of the notebooks as LibTorch C++ modules.
///
///   #include <torchattn/torchattn.h>
///   torch::manual_seed(123);
///   torchattn::MultiHeadAttention mha(/*d_in=*/3, /*d_out=*/2, /*context_length=*/6,
///                                     /*dropout=*/0.0, /*num_heads=*/2);
///   auto y = mha(x);  // x: [B, T, 3] -> y: [B, T, 2]
///
/// flex_attention (score and mask mods as C++ lambdas, compiled into the caller's kernels)
/// is not in this header: #include <torchattn/flex_attention.h> where it is used. The
/// ready-made variants a module takes (flex/variants.h) are.

#include <torchattn/activation_checkpoint.h>
#include <torchattn/attention_options.h>
#include <torchattn/backend.h>
#include <torchattn/causal_attention.h>
#include <torchattn/checkpoint_facts.h>
#include <torchattn/decode_graph.h>
#include <torchattn/flex/variants.h>
#include <torchattn/functional.h>
#include <torchattn/interop.h>
#include <torchattn/kv_cache.h>
#include <torchattn/linear.h>
#include <torchattn/multi_head_attention.h>
#include <torchattn/packed_linear.h>
#include <torchattn/padding.h>
#include <torchattn/paged_kv_cache.h>
#include <torchattn/qk_norm.h>
#include <torchattn/rms_norm.h>
#include <torchattn/rope.h>
#include <torchattn/checksum.h>
#include <torchattn/safetensors.h>
#include <torchattn/self_attention_v2.h>
#include <torchattn/torch_mha_interop.h>
#include <torchattn/version.h>
#include <torchattn/weight_format.h>
