// Activation checkpointing (include/torchattn/activation_checkpoint.h) as a custom
// autograd function: its forward runs fn without recording and keeps the inputs; its
// backward sets the random generators and autocast as they were, runs fn again with
// recording, differentiates that with respect to the inputs and the params, and puts
// the generators back.

#include <torchattn/activation_checkpoint.h>

#include "kernels/cpu/needs_grad.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace torchattn {

namespace {

constexpr const char* kFn = "checkpoint";

// The default generators fn may draw from, and their states at one moment.
struct RngStates {
  std::vector<at::Generator> generators;
  std::vector<at::Tensor> states;

  // The CPU's and, for each CUDA device among `tensors`, that device's.
  static RngStates capture(at::TensorList tensors) {
    RngStates s;
    std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
    for (const at::Tensor& t : tensors) {
      if (t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
    for (const c10::Device& d : devices) {
      at::Generator g = at::globalContext().defaultGenerator(d);
      std::lock_guard<std::mutex> lock(g.mutex());
      s.states.push_back(g.get_state());
      s.generators.push_back(std::move(g));
    }
    return s;
  }

  // The same generators' states now.
  RngStates now() const {
    RngStates s;
    for (at::Generator g : generators) {  // a handle: the copy is the same generator
      std::lock_guard<std::mutex> lock(g.mutex());
      s.states.push_back(g.get_state());
      s.generators.push_back(g);
    }
    return s;
  }

  void restore() const {
    for (size_t i = 0; i < generators.size(); ++i) {
      at::Generator g = generators[i];
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(states[i]);
    }
  }
};

// Autocast of the CPU and CUDA, as it was.
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;

  static AutocastState capture() {
    AutocastState s;
    s.cpu = at::autocast::is_autocast_enabled(at::kCPU);
    s.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    return s;
  }

  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
};

// What the backward needs besides the saved inputs.
struct Recompute : torch::CustomClassHolder {
  CheckpointFunction fn;
  std::vector<at::Tensor> params;
  RngStates rng;
  AutocastState autocast;
  // Each output of the forward, which the recomputation must give again.
  struct Output {
    at::ScalarType dtype;
    at::Device device;
    std::vector<int64_t> sizes;
  };
  std::vector<Output> outputs;
};

std::vector<at::Tensor> run_checked(const CheckpointFunction& fn, const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> out = fn(inputs);
  TORCH_CHECK(!out.empty(), kFn, ": expected fn to return at least one tensor, got none");
  for (size_t i = 0; i < out.size(); ++i) {
    TORCH_CHECK(out[i].defined(), kFn, ": expected fn's outputs defined, got an undefined tensor at ", i);
  }
  return out;
}

struct CheckpointNode : public torch::autograd::Function<CheckpointNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const CheckpointFunction& fn,
                                                at::TensorList inputs, at::TensorList params) {
    auto r = c10::make_intrusive<Recompute>();
    r->fn = fn;
    r->params = params.vec();
    r->rng = RngStates::capture(inputs);
    r->autocast = AutocastState::capture();
    // The kernels the recomputation (with a gradient) will take, not the faster ones
    // of a forward without one: the same bits both times.
    std::vector<at::Tensor> outputs;
    {
      const kernels::cpu::RecomputedForward same_kernels;
      outputs = run_checked(fn, inputs.vec());
    }
    // An output that is an input, or a view of one, would alias what the graph saved.
    for (at::Tensor& o : outputs) {
      for (const at::Tensor& i : inputs) {
        if (o.is_alias_of(i)) {
          o = o.clone();
          break;
        }
      }
    }
    for (const at::Tensor& o : outputs) r->outputs.push_back({o.scalar_type(), o.device(), o.sizes().vec()});
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(std::move(r));
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto r = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (const at::Tensor& s : saved) {
      inputs.push_back(s.detach().requires_grad_(s.requires_grad()));
    }

    const RngStates after = r->rng.now();
    const AutocastState outer = AutocastState::capture();
    std::vector<at::Tensor> outputs;
    r->rng.restore();
    r->autocast.apply();
    try {
      at::AutoGradMode record(true);
      outputs = run_checked(r->fn, inputs);
    } catch (...) {
      outer.apply();
      after.restore();
      throw;
    }
    outer.apply();
    after.restore();
    TORCH_CHECK(outputs.size() == grad_outputs.size(), kFn, ": fn returned ", grad_outputs.size(),
                " tensors in the forward and ", outputs.size(),
                " when recomputed: fn runs again in the backward and must compute the same thing");
    for (size_t k = 0; k < outputs.size(); ++k) {
      const at::Tensor& o = outputs[k];
      const Recompute::Output& f = r->outputs[k];
      TORCH_CHECK(o.sizes().vec() == f.sizes && o.scalar_type() == f.dtype && o.device() == f.device, kFn,
                  ": fn's output ", k, " was ", f.dtype, " ", at::IntArrayRef(f.sizes), " on ", f.device,
                  " in the forward and ", o.scalar_type(), " ", o.sizes(), " on ", o.device(),
                  " when recomputed: fn runs again in the backward and must compute the same thing (a function "
                  "of its inputs, params and the random state alone)");
    }

    std::vector<at::Tensor> outs, grads_in;
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (outputs[k].requires_grad() && grad_outputs[k].defined()) {
        outs.push_back(outputs[k]);
        grads_in.push_back(grad_outputs[k]);
      }
    }
    std::vector<at::Tensor> wrt;
    std::vector<size_t> slot;  // where each of wrt goes among inputs, then params
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        slot.push_back(i);
      }
    }
    for (size_t j = 0; j < r->params.size(); ++j) {
      if (r->params[j].requires_grad()) {
        wrt.push_back(r->params[j]);
        slot.push_back(inputs.size() + j);
      }
    }
    // One entry per argument of forward: fn (none), then each input and each param.
    torch::autograd::variable_list result(1 + inputs.size() + r->params.size());
    if (outs.empty() || wrt.empty()) {
      return result;
    }
    const torch::autograd::variable_list grads = torch::autograd::grad(outs, wrt, grads_in, /*retain_graph=*/false,
                                                                       /*create_graph=*/false,
                                                                       /*allow_unused=*/true);
    for (size_t w = 0; w < wrt.size(); ++w) {
      result[1 + slot[w]] = grads[w];
    }
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& params) {
  TORCH_CHECK(fn, kFn, ": expected a function, got an empty one");
  bool wants_grad = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].defined(), kFn, ": expected inputs defined, got an undefined tensor at ", i);
    wants_grad = wants_grad || inputs[i].requires_grad();
  }
  for (size_t j = 0; j < params.size(); ++j) {
    TORCH_CHECK(params[j].defined(), kFn, ": expected params defined, got an undefined tensor at ", j);
    wants_grad = wants_grad || params[j].requires_grad();
  }
  if (!c10::GradMode::is_enabled() || !wants_grad) {
    return run_checked(fn, inputs);
  }
  return CheckpointNode::apply(fn, at::TensorList(inputs), at::TensorList(params));
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& params) {
  TORCH_CHECK(fn, kFn, ": expected a function, got an empty one");
  // fn by value: the backward calls it after this call's arguments are gone.
  return checkpoint([fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; },
                    std::vector<at::Tensor>{input}, params)[0];
}

}  // namespace torchattn
