#pragma once

// Data-parallel training on PyTorch's own c10d engine: ProcessGroupGloo over a
// TCPStore (or FileStore) rendezvous. Gradients are all-reduced and averaged.

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace train_gpt {

struct DistOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string store_file;  // use a FileStore at this path instead of a TCPStore
  int timeout_s = 60;      // every collective and the rendezvous give up after this
};

class Distributed {
 public:
  explicit Distributed(const DistOptions& options);
  ~Distributed();

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  bool active() const { return options_.world_size > 1; }

  /// Makes every rank start from rank 0's parameters.
  void broadcast_parameters(torch::nn::Module& module);
  /// Sums every gradient over the ranks and divides by world_size (one flat all-reduce).
  void average_gradients(torch::nn::Module& module);
  /// The mean of `value` over the ranks.
  double average(double value);

 private:
  struct Impl;
  DistOptions options_;
  std::unique_ptr<Impl> impl_;
};

/// Runs `argv` (this program) as `nproc` local ranks with --rank/--world-size/
/// --master-port added, and waits. If a rank fails, the others get `grace_s`
/// seconds to exit on their own (their collectives time out) and are then killed.
/// Returns 0 when every rank succeeded.
int launch_local_ranks(int nproc, const std::vector<std::string>& argv, int grace_s);

}  // namespace train_gpt
