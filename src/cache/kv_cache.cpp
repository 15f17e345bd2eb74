#include <torchattn/kv_cache.h>

#include "cache/append_watch.h"
#include "kernels/cuda/static_cache_write.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

namespace torchattn {

namespace {
constexpr const char* kEmpty = "KVCache: this cache is empty; make one with module->make_kv_cache(batch_size)";
}

KVCache::KVCache(c10::IntArrayRef shape, at::TensorOptions options, bool static_shapes, uint64_t owner)
    : static_shapes_(static_shapes), owner_(owner) {
  TORCH_CHECK(shape.size() >= 2, "KVCache: expected a storage shape [..., capacity, d], got ", shape);
  for (int64_t s : shape) {
    TORCH_CHECK(s > 0, "KVCache: expected positive sizes, got ", shape);
  }
  keys_ = at::zeros(shape, options);
  values_ = at::zeros(shape, options);
  position_ = at::zeros({1}, options.dtype(at::kLong));
}

KVCache KVCache::clone() const {
  KVCache copy;
  if (!defined()) {
    return copy;
  }
  copy.keys_ = keys_.clone();
  copy.values_ = values_.clone();
  copy.position_ = position_.clone();
  copy.padding_ = padding_.defined() ? padding_.clone() : at::Tensor();
  copy.length_ = length_;
  copy.static_shapes_ = static_shapes_;
  copy.owner_ = owner_;
  return copy;
}

void KVCache::truncate(int64_t length) {
  TORCH_CHECK(length >= 0 && length <= length_, "KVCache: truncate expected a length in [0, ", length_, "], got ",
              length);
  length_ = length;
  if (position_.defined()) {
    position_.fill_(length);
  }
  if (length == 0 && padding_.defined()) {
    // A captured graph may read the static cache's padding storage: keep it, cleared.
    if (static_shapes_) {
      padding_.fill_(false);
    } else {
      padding_ = at::Tensor();
    }
  }
}

int64_t KVCache::capacity() const {
  TORCH_CHECK(defined(), kEmpty);
  return keys_.size(-2);
}

int64_t KVCache::batch_size() const {
  TORCH_CHECK(defined(), kEmpty);
  return keys_.size(0);
}

at::Tensor KVCache::token_positions() const {
  TORCH_CHECK(defined(), kEmpty);
  const int64_t B = keys_.size(0);
  if (!padding_.defined()) {
    return position_.expand({B}).clone();  // not a view of the write index
  }
  if (static_shapes_) {
    // The written slots are those before position(), on the device.
    const at::Tensor written = at::arange(padding_.size(1), position_.options()) < position_;
    return written.logical_and(padding_.logical_not()).sum(-1);
  }
  return padding().logical_not().sum(-1);
}

at::Tensor KVCache::keys() const { return keys_.narrow(-2, 0, length_); }

at::Tensor KVCache::values() const { return values_.narrow(-2, 0, length_); }

at::Tensor KVCache::padding() const { return padding_.defined() ? padding_.narrow(1, 0, length_) : at::Tensor(); }

void KVCache::write_padding(const at::Tensor& index, int64_t t_new, const at::Tensor& key_padding_mask) {
  if (!key_padding_mask.defined() && !padding_.defined()) {
    return;  // no token so far was padding, nor are these
  }
  const int64_t B = keys_.size(0);
  if (!padding_.defined()) {
    padding_ = at::zeros({B, capacity()}, keys_.options().dtype(at::kBool));
  }
  const at::Tensor src = key_padding_mask.defined() ? key_padding_mask.expand({B, t_new})
                                                    : at::zeros({B, t_new}, padding_.options());
  if (index.defined()) {
    padding_.index_copy_(1, index, src);
  } else {
    padding_.narrow(1, length_, t_new).copy_(src);
  }
}

int64_t KVCache::append(const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_padding_mask) {
  TORCH_CHECK(defined(), kEmpty);
  TORCH_CHECK(k.sizes() == v.sizes(), "KVCache: expected keys and values of one shape, got ", k.sizes(), " and ",
              v.sizes());
  TORCH_CHECK(k.dim() == keys_.dim(), "KVCache: expected keys of rank ", keys_.dim(), ", got ", k.sizes());
  for (int64_t d = 0; d < k.dim(); ++d) {
    TORCH_CHECK(d == k.dim() - 2 || k.size(d) == keys_.size(d), "KVCache: expected keys shaped like the storage ",
                keys_.sizes(), " but for the token dimension, got ", k.sizes(),
                (d == 0 ? " (batch_size differs from the cache's)" : ""));
  }
  TORCH_CHECK(k.scalar_type() == keys_.scalar_type() && k.device() == keys_.device(),
              "KVCache: expected keys of dtype ", keys_.scalar_type(), " on ", keys_.device(), ", got ",
              k.scalar_type(), " on ", k.device(), "; make the cache after moving the module");
  const int64_t t_new = k.size(-2);
  TORCH_CHECK(length_ + t_new <= capacity(), "KVCache: the cache holds ", length_, " of its capacity of ", capacity(),
              " tokens and cannot take ", t_new, " more; call cache.reset() to start again");
  if (key_padding_mask.defined()) {
    const int64_t B = keys_.size(0);
    TORCH_CHECK(key_padding_mask.scalar_type() == at::kBool, "KVCache: expected a bool key_padding_mask, got ",
                key_padding_mask.scalar_type());
    TORCH_CHECK(key_padding_mask.dim() == 2 && (key_padding_mask.size(0) == B || key_padding_mask.size(0) == 1) &&
                    key_padding_mask.size(1) == t_new,
                "KVCache: expected key_padding_mask of shape [", B, ", ", t_new, "] (or [1, ", t_new, "]), got ",
                key_padding_mask.sizes());
    TORCH_CHECK(key_padding_mask.device() == keys_.device(), "KVCache: expected key_padding_mask on ", keys_.device(),
                ", got ", key_padding_mask.device());
  }
  at::Tensor index;
  if (static_shapes_) {
    // Written where the device says, so that a captured graph writes at the
    // position of each replay: on CUDA keys and values in one kernel that reads the
    // position itself, else index_copy_. A decoding step's one token is written at
    // position_ itself (read before the add_ below, in stream order): no index kernels.
    bool written = false;
#ifdef TORCHATTN_WITH_CUDA
    if (kernels::cuda::static_cache_write_applies(keys_, values_, k, v, position_)) {
      kernels::cuda::static_cache_write(keys_, values_, k, v, position_);
      written = true;
    }
#endif
    if (!written || key_padding_mask.defined() || padding_.defined()) {
      index = t_new == 1 ? position_ : position_ + at::arange(t_new, position_.options());
    }
    if (!written) {
      keys_.index_copy_(-2, index, k);
      values_.index_copy_(-2, index, v);
    }
  } else {
    keys_.narrow(-2, length_, t_new).copy_(k);
    values_.narrow(-2, length_, t_new).copy_(v);
  }
  write_padding(index, t_new, key_padding_mask);
  position_.add_(t_new);
  const int64_t past = length_;
  length_ += t_new;
  cache::note_append(this, static_shapes_, length_);
  return past;
}

}  // namespace torchattn
