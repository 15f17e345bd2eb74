#include "distributed.h"

#include "fmt.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace train_gpt {

struct Distributed::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

namespace {

// Runs a collective; a failure (a peer that died, a timeout) becomes one clear error.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, const DistOptions& o, const char* what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "train_gpt rank ", o.rank, ": ", what, " failed (did another rank exit?): ", e.what());
  }
}

}  // namespace

Distributed::Distributed(const DistOptions& o) : options_(o), impl_(std::make_unique<Impl>()) {
  if (!active()) return;
  TORCH_CHECK(o.rank >= 0 && o.rank < o.world_size, "train_gpt: expected 0 <= --rank < --world-size=", o.world_size,
              ", got ", o.rank);
  const auto timeout = std::chrono::milliseconds(1000LL * o.timeout_s);
  try {
    if (!o.store_file.empty()) {
      impl_->store = c10::make_intrusive<c10d::FileStore>(o.store_file, o.world_size);
    } else {
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(o.master_port);
      so.isServer = o.rank == 0;
      so.numWorkers = o.world_size;
      so.waitWorkers = true;
      so.timeout = timeout;
      impl_->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    }
    impl_->store->setTimeout(timeout);
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    options->timeout = timeout;
    impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, o.rank, o.world_size, options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "train_gpt rank ", o.rank, ": rendezvous with ", o.world_size, " ranks at ",
                o.store_file.empty() ? o.master_addr + ":" + std::to_string(o.master_port) : o.store_file,
                " failed: ", e.what());
  }
}

Distributed::~Distributed() = default;

void Distributed::broadcast_parameters(torch::nn::Module& module) {
  if (!active()) return;
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    std::vector<at::Tensor> t{p.data()};
    wait_for(impl_->pg->broadcast(t), options_, "broadcast of the parameters");
  }
}

void Distributed::average_gradients(torch::nn::Module& module) {
  if (!active()) return;
  std::vector<at::Tensor> grads;
  for (auto& p : module.parameters()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  std::vector<at::Tensor> flat{torch::cat([&] {
    std::vector<at::Tensor> views;
    for (auto& g : grads) views.push_back(g.reshape(-1));
    return views;
  }())};
  wait_for(impl_->pg->allreduce(flat), options_, "gradient all-reduce");
  flat[0].div_(options_.world_size);
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat[0].narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

double Distributed::average(double value) {
  if (!active()) return value;
  std::vector<at::Tensor> t{torch::tensor({value}, torch::kFloat64)};
  wait_for(impl_->pg->allreduce(t), options_, "loss all-reduce");
  return t[0].item<double>() / options_.world_size;
}

namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 29500;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

}  // namespace

int launch_local_ranks(int nproc, const std::vector<std::string>& argv, int grace_s) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> args = argv;
    for (const auto& extra : {std::string("--rank"), std::to_string(r), std::string("--world-size"),
                              std::to_string(nproc), std::string("--master-port"), std::to_string(port)}) {
      args.push_back(extra);
    }
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    const pid_t pid = ::fork();
    TORCH_CHECK(pid >= 0, "train_gpt: fork failed");
    if (pid == 0) {
      ::execv("/proc/self/exe", cargs.data());
      std::perror("train_gpt: exec");
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  auto deadline = std::chrono::steady_clock::time_point::max();
  std::vector<bool> done(nproc, false);
  for (int left = nproc; left > 0;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < nproc; ++r) {
        if (pids[r] != pid) continue;
        done[r] = true;
        --left;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok) {
          fmt::print(stderr, "train_gpt: rank {} {} {}\n", r,
                     WIFEXITED(status) ? "exited with status" : "killed by signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
          if (!failed) deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
          ++failed;
        }
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < nproc; ++r) {
        if (!done[r]) {
          fmt::print(stderr, "train_gpt: rank {} still running {} s after another failed: killing it\n", r, grace_s);
          ::kill(pids[r], SIGKILL);
        }
      }
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return failed ? 1 : 0;
}

}  // namespace train_gpt
