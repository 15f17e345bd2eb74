// Prints a module's output for a seed and shape, one hex float a line, so that
// tests/consumer/check_consumer.py can compare it with the notebooks' Python code.
//
//   consumer MODULE SEED B T D_IN D_OUT CONTEXT_LENGTH NUM_HEADS

#include <torchattn/torchattn.h>

#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 9) {
    std::cerr << "usage: consumer MODULE SEED B T D_IN D_OUT CONTEXT_LENGTH NUM_HEADS\n";
    return 2;
  }
  const std::string kind = argv[1];
  const int64_t seed = std::stoll(argv[2]), B = std::stoll(argv[3]), T = std::stoll(argv[4]),
                d_in = std::stoll(argv[5]), d_out = std::stoll(argv[6]), C = std::stoll(argv[7]),
                H = std::stoll(argv[8]);
  try {
    torch::manual_seed(seed);
    torch::nn::AnyModule m;
    if (kind == "SelfAttentionV2") {
      m = torch::nn::AnyModule(torchattn::SelfAttentionV2(d_in, d_out));
    } else if (kind == "CausalAttention") {
      m = torch::nn::AnyModule(torchattn::CausalAttention(d_in, d_out, C, 0.0));
    } else {
      m = torch::nn::AnyModule(torchattn::MultiHeadAttention(d_in, d_out, C, 0.0, H));
    }
    torch::manual_seed(seed + 1);
    auto x = torch::randn({B, T, d_in});
    auto y = m.forward(x).contiguous();
    const float* p = y.data_ptr<float>();
    for (int64_t i = 0; i < y.numel(); ++i) {
      std::printf("%a\n", static_cast<double>(p[i]));
    }
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 1;
  }
  return 0;
}
