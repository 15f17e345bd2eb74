// train_gpt: trains a small byte-level GPT built on torchattn::MultiHeadAttention,
// then samples from it with the KV cache.
//
//   train_gpt [--steps 1500] [--out runs/gpt] [--resume runs/gpt] [--nproc 2] ...
//
// Data: any UTF-8 text files (--data, repeatable); by default the fortune files of
// Debian's `fortunes` package. Bytes are tokens (vocabulary 256); the last 10% of
// the text is held out for the eval loss.
//
// Data-parallel: --nproc N runs N local ranks; --rank/--world-size/--master-addr/
// --master-port join ranks across machines. Each step draws one global batch of
// batch_size * world_size sequences (from the seed and the step alone); rank r takes
// its own slice of it, so N ranks compute what one process computes on the union
// (exactly so without dropout: each rank draws its own dropout masks).
//
// Documents: by default each step trains on windows of --context bytes cut anywhere in
// the text (across the fortunes' boundaries). --pack trains on whole documents (each
// fortune one; longer ones cut at --context + 1 bytes) laid end to end in one row,
// each attending within itself with its positions from 0 (forward_packed: no padding,
// no [N, N] mask); --pad draws the same documents and pads them to the step's longest
// (the padding masked out of the loss). Both draw --batch-size documents a step from
// the seed and the step alone, so they train on the same documents with the same loss
// and differ in the time spent on padding; the tokens/s they report are useful ones
// (tokens with a target). Their eval loss is over held-out documents (packed).
// --checkpoint-activations recomputes each block's activations in the backward
// (torchattn::checkpoint). The peak RSS is printed at the end.
//
// GPU: --device cuda trains on one GPU with bf16 autocast (--precision bf16, the
// default there): weights, gradients and AdamW state stay float32 (master weights),
// matrix products and attention run in bf16. --precision fp32 turns autocast off.
// Sampling then replays each decoding step from a CUDA graph (torchattn::DecodeGraph).
// --optimizer fused (the default on CUDA) runs AdamW as one fused kernel a parameter
// group and clips without waiting for the GPU (optimizer.h); loop (the CPU's default)
// is LibTorch's torch::optim::AdamW and clip_grad_norm_.
// Data-parallel runs (--nproc, --world-size) stay on the CPU over Gloo.

#include "cli_checks.h"
#include "distributed.h"
#include "documents.h"
#include "fmt.h"
#include "gpt.h"
#include "optimizer.h"

#include <torchattn/interop.h>

#include <ATen/autocast_mode.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using train_gpt::GPT;
using train_gpt::GPTConfig;

namespace {

struct Text {
  std::vector<uint8_t> train, eval;
  std::string source;
};

std::vector<std::string> default_data() {
  std::vector<std::string> files;
  // TORCHATTN_FORTUNES: a copy of the fortunes on a machine without the package.
  const char* env = std::getenv("TORCHATTN_FORTUNES");
  const fs::path dir = env != nullptr ? env : "/usr/share/games/fortunes";
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The offset of the first byte of `bytes` [begin, end) that is not valid UTF-8 (a bad
// lead byte, a missing or stray continuation byte, an overlong form, a surrogate or a
// code point past U+10FFFF), or `end` when all of it is.
size_t first_invalid_utf8(const std::vector<uint8_t>& bytes, size_t begin, size_t end) {
  size_t i = begin;
  while (i < end) {
    const uint8_t c = bytes[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || c >= 0xF5 || c == 0xC0 || c == 0xC1 || i + n > end) return i;
    uint32_t cp = c & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) {
      if ((bytes[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (bytes[i + k] & 0x3F);
    }
    const uint32_t least = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n;
  }
  return end;
}

// The share of `bytes` [begin, end) (valid UTF-8) that is printable text: characters
// other than the C0 and C1 controls and DEL, tabs and line ends counted as text.
double printable_share(const std::vector<uint8_t>& bytes, size_t begin, size_t end) {
  size_t characters = 0, printable = 0;
  for (size_t i = begin; i < end; ++i) {
    const uint8_t b = bytes[i];
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: its character counted at its lead
    ++characters;
    const bool c1 = b == 0xC2 && i + 1 < end && bytes[i + 1] >= 0x80 && bytes[i + 1] <= 0x9F;
    const bool control = (b < 0x20 && b != '\t' && b != '\n' && b != '\r') || b == 0x7F || c1;
    if (!control) ++printable;
  }
  return characters == 0 ? 1.0 : static_cast<double>(printable) / static_cast<double>(characters);
}

// Text's least share of printable characters (a text file of words has nearly all).
constexpr double kLeastPrintable = 0.95;

Text load_text(const std::vector<std::string>& files) {
  TORCH_CHECK(!files.empty(), "train_gpt: no text: pass --data FILE, or install Debian's `fortunes` package");
  std::vector<uint8_t> all;
  for (const auto& f : files) {
    TORCH_CHECK(!fs::is_directory(f), "train_gpt: --data '", f, "' is a folder; expected UTF-8 text files");
    std::ifstream in(f, std::ios::binary);
    TORCH_CHECK(in, "train_gpt: cannot read --data '", f, "'");
    const size_t begin = all.size();
    all.insert(all.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    const size_t bad = first_invalid_utf8(all, begin, all.size());
    TORCH_CHECK(bad == all.size(), "train_gpt: --data '", f, "': expected UTF-8 text, got the byte ",
                fmt::format("0x{:02X}", all[std::min(bad, all.size() - 1)]), " at offset ", bad - begin,
                ", which is not valid UTF-8 (a binary file?)");
    const double share = printable_share(all, begin, all.size());
    TORCH_CHECK(share >= kLeastPrintable, "train_gpt: --data '", f, "': expected text, got ",
                fmt::format("{:.1f}% printable characters", 100.0 * share),
                " (valid UTF-8, but mostly control "
                "characters: text has at least ",
                fmt::format("{:.0f}%", 100.0 * kLeastPrintable), ", its tabs and line ends counted as printable)");
  }
  TORCH_CHECK(all.size() > 10000, "train_gpt: expected at least 10000 bytes of text, got ", all.size());
  const size_t cut = all.size() * 9 / 10;
  Text t;
  t.train.assign(all.begin(), all.begin() + cut);
  t.eval.assign(all.begin() + cut, all.end());
  t.source = std::to_string(files.size()) + " file(s), " + std::to_string(all.size()) + " bytes";
  return t;
}

// Sequences [first, first+count) of the global batch for `step`: inputs and next-byte
// targets, [count, T] each. The offsets depend only on (seed, step).
std::pair<torch::Tensor, torch::Tensor> batch(const std::vector<uint8_t>& data, int64_t T, int64_t global,
                                              int64_t first, int64_t count, uint64_t seed, int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(step));
  auto offsets = torch::randint(static_cast<int64_t>(data.size()) - T - 1, {global}, gen, torch::kLong);
  auto x = torch::empty({count, T}, torch::kLong), y = torch::empty({count, T}, torch::kLong);
  auto xa = x.accessor<int64_t, 2>(), ya = y.accessor<int64_t, 2>();
  for (int64_t b = 0; b < count; ++b) {
    const int64_t o = offsets[first + b].item<int64_t>();
    for (int64_t t = 0; t < T; ++t) {
      xa[b][t] = data[o + t];
      ya[b][t] = data[o + t + 1];
    }
  }
  return {x, y};
}

double lr_at(int64_t step, int64_t steps, int64_t warmup, double lr) {
  if (step < warmup) return lr * (step + 1) / warmup;
  const double progress = static_cast<double>(step - warmup) / std::max<int64_t>(1, steps - warmup);
  return lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress))));
}

// The process's peak resident memory so far (VmHWM), in MiB; -1 where unknown.
double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmHWM:")) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1.0;
}

std::string clock_text(double s) { return fmt::format("{}:{:02}", static_cast<int>(s) / 60, static_cast<int>(s) % 60); }

struct Progress {
  int64_t total;
  bool tty = ::isatty(STDERR_FILENO);
  void show(int64_t step, double loss, double tok_s, double eta_s) const {
    const int width = 24, filled = static_cast<int>(width * step / std::max<int64_t>(total, 1));
    std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    const std::string line = fmt::format("step {:5}/{} [{}] loss {:.3f} | {:7.0f} tok/s | ETA {}", step, total, bar,
                                         loss, tok_s, clock_text(eta_s));
    if (tty) {
      fmt::print(stderr, "\r{}", line);
    } else if (step == total || step % std::max<int64_t>(1, total / 20) == 0) {
      fmt::print(stderr, "{}\n", line);
    }
  }
};

// bf16 autocast on CUDA for the scope of one forward (and loss), as torch.autocast
// in Python: thread-local, restored on exit, its cast cache cleared.
class AutocastScope {
 public:
  explicit AutocastScope(bool on) : on_(on) {
    if (on_) {
      was_ = at::autocast::is_autocast_enabled(at::kCUDA);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
    }
  }
  ~AutocastScope() {
    if (on_) {
      at::autocast::set_autocast_enabled(at::kCUDA, was_);
      at::autocast::clear_cache();
    }
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_;
  bool was_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train_gpt: a small byte-level GPT on torchattn::MultiHeadAttention"};
  GPTConfig cfg;
  int64_t steps = 1500, batch_size = 16, warmup = 100, eval_every = 250, eval_batches = 8, sample_tokens = 400,
          top_k = 40, die_at_step = -1, save_every = 500, mmap_threshold = int64_t{1} << 20;
  double lr = 3e-3, weight_decay = 0.1, clip = 1.0, temperature = 0.8;
  uint64_t seed = 1337;
  int threads = 0, nproc = 1;
  std::string out_dir = "runs/gpt", resume, prompt = "Q: What", device_name = "cpu", precision = "auto",
              optimizer = "auto";
  std::vector<std::string> data;
  train_gpt::DistOptions dist;
  app.add_option("--data", data, "UTF-8 text file(s) (default: the fortunes of Debian's fortunes package)");
  app.add_option("--steps", steps, "optimizer steps")->check(apps::at_least(1));
  app.add_option("--batch-size", batch_size, "sequences per step and rank")->check(apps::at_least(1));
  app.add_option("--context", cfg.context_length, "tokens per sequence (at least 2: the sample's prompt and a token)")
      ->check(apps::at_least(2));
  app.add_option("--d-model", cfg.d_model, "model width")->check(apps::at_least(1));
  app.add_option("--layers", cfg.n_layer, "blocks")->check(apps::at_least(1));
  app.add_option("--heads", cfg.n_head, "attention heads")->check(apps::at_least(1));
  app.add_option("--dropout", cfg.dropout, "dropout in attention and MLP")->check(apps::real_in(0.0, 1.0, true));
  app.add_option("--lr", lr, "peak learning rate (AdamW)")->check(apps::positive_real());
  app.add_option("--warmup", warmup, "linear warm-up steps, then cosine decay to lr/10")->check(apps::at_least(0));
  app.add_option("--weight-decay", weight_decay, "AdamW weight decay on matrices")->check(apps::real_in(0.0, INFINITY));
  app.add_option("--clip", clip, "gradient-norm clipping")->check(apps::positive_real());
  app.add_option("--eval-every", eval_every, "steps between eval losses (0: only at the end)")
      ->check(apps::at_least(0));
  app.add_option("--eval-batches", eval_batches, "batches in one eval loss")->check(apps::at_least(1));
  app.add_option("--save-every", save_every, "steps between checkpoints (0: only at the end)")
      ->check(apps::at_least(0));
  app.add_option("--seed", seed, "weights, batches and sampling");
  app.add_option("--threads", threads, "intra-op threads per rank (default: cores / ranks)")->check(apps::at_least(1));
  app.add_option("--out", out_dir, "checkpoint, loss.csv and final weights go here");
  app.add_option("--resume", resume, "continue exactly from the checkpoint in this directory");
  app.add_option("--sample-tokens", sample_tokens, "bytes to generate at the end (KV cache)")->check(apps::at_least(0));
  app.add_option("--prompt", prompt, "the sample's prompt");
  app.add_option("--temperature", temperature, "sampling temperature")->check(apps::positive_real());
  app.add_option("--top-k", top_k, "sample among the k likeliest bytes (0: all)")->check(apps::at_least(0));
  app.add_option("--device", device_name, "cpu, or cuda (one GPU)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--precision", precision, "auto (bf16 on cuda, fp32 on cpu), fp32, or bf16 (CUDA autocast)")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  app.add_option("--optimizer", optimizer,
                 "auto (fused on cuda, loop on cpu), loop (torch::optim::AdamW, clip_grad_norm_), or fused "
                 "(at::_fused_adamw_, a clip that does not wait for the device)")
      ->check(CLI::IsMember({"auto", "loop", "fused"}));
  app.add_option("--nproc", nproc, "local ranks to start (data-parallel over c10d/Gloo)")->check(apps::at_least(1));
  app.add_option("--rank", dist.rank, "this process's rank (multi-machine)")->check(apps::at_least(0));
  app.add_option("--world-size", dist.world_size, "ranks in all (multi-machine)")->check(apps::at_least(1));
  app.add_option("--master-addr", dist.master_addr, "rank 0's address for the TCPStore rendezvous");
  app.add_option("--master-port", dist.master_port, "rank 0's port for the TCPStore rendezvous")
      ->check(CLI::Range(1, 65535));
  app.add_option("--store-file", dist.store_file, "rendezvous through a FileStore at this path instead");
  app.add_option("--timeout", dist.timeout_s, "seconds before a collective or the rendezvous gives up")
      ->check(apps::at_least(1));
  bool pack = false, pad = false;
  app.add_flag("--pack", pack, "train on whole documents packed end to end (no padding)");
  app.add_flag("--pad", pad, "train on whole documents padded to each step's longest")->excludes("--pack");
  app.add_flag("--checkpoint-activations", cfg.checkpoint_activations,
               "recompute each block's activations in the backward (less memory)");
  int die_rank = 1;
  app.add_option("--mmap-threshold", mmap_threshold,
                 "bytes from which glibc maps each allocation on its own and unmaps it when freed "
                 "(0: glibc's own threshold, which rises as large blocks are freed)")
      ->check(apps::at_least(0));
  app.add_option("--die-at-step", die_at_step, "(testing) rank --die-rank exits abruptly at this step")->group("");
  app.add_option("--die-rank", die_rank, "(testing) the rank that --die-at-step stops")->group("");
  CLI11_PARSE(app, argc, argv);
  // This program's allocator policy (the library sets none). glibc serves a block below
  // its mmap threshold from its heap, and raises that threshold (up to 32 MiB) each time
  // a larger mapped block is freed: a step's activations then come from the heap, which
  // keeps what it freed, and the peak RSS counts that fragmentation on top of what is
  // live (the last rows of apps/bench/results/packed.md's checkpointing table). Fixed at
  // 1 MiB, every tensor of a few rows or more is mapped and returned when freed.
  if (mmap_threshold > 0 &&
      mallopt(M_MMAP_THRESHOLD, static_cast<int>(std::min<int64_t>(mmap_threshold, INT32_MAX))) != 1) {
    fmt::print(stderr, "train_gpt: glibc refused --mmap-threshold {}\n", mmap_threshold);
    return 1;
  }

  const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);
  if (device.is_cuda() && (nproc > 1 || dist.world_size > 1)) {
    fmt::print(stderr, "train_gpt: --nproc and --world-size run data-parallel over Gloo on the CPU; "
                       "--device cuda trains on one GPU\n");
    return 1;
  }
  if (device.is_cuda() && !torch::cuda::is_available()) {
    fmt::print(stderr, "train_gpt: --device cuda, but this LibTorch sees no CUDA device\n");
    return 1;
  }
  if (precision == "bf16" && !device.is_cuda()) {
    fmt::print(stderr, "train_gpt: --precision bf16 is CUDA autocast; use it with --device cuda\n");
    return 1;
  }
  const bool amp = device.is_cuda() && precision != "fp32";
  const bool fused = train_gpt::optimizer_kind(optimizer, device.is_cuda()) == train_gpt::OptimizerKind::Fused;
  if (nproc > 1 && dist.world_size == 1) {
    std::vector<std::string> args(argv, argv + argc);
    for (size_t i = 0; i < args.size(); ++i) {  // drop --nproc N
      if (args[i] == "--nproc" && i + 1 < args.size()) {
        args.erase(args.begin() + i, args.begin() + i + 2);
        break;
      }
    }
    if (threads == 0) {
      args.push_back("--threads");
      args.push_back(std::to_string(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / nproc)));
    }
    return train_gpt::launch_local_ranks(nproc, args, dist.timeout_s + 10);
  }

  try {
    // The default prompt is cut to fit a short --context; one the user gave must fit.
    if (app.count("--prompt") == 0 && static_cast<int64_t>(prompt.size()) >= cfg.context_length) {
      prompt.resize(static_cast<size_t>(cfg.context_length - 1));
    }
    TORCH_CHECK(!prompt.empty() && static_cast<int64_t>(prompt.size()) < cfg.context_length,
                "train_gpt: expected a --prompt of 1 to ", cfg.context_length - 1, " bytes (below --context ",
                cfg.context_length, "), got ", prompt.size());
    TORCH_CHECK(cfg.d_model % cfg.n_head == 0, "train_gpt: expected --d-model divisible by --heads (", cfg.n_head,
                "), got --d-model ", cfg.d_model);
    if (threads > 0) at::set_num_threads(threads);
    train_gpt::Distributed ddp(dist);
    const bool lead = ddp.rank() == 0;
    const Text text = load_text(data.empty() ? default_data() : data);
    const int64_t T = cfg.context_length, global = batch_size * ddp.world_size();
    const bool documents = pack || pad;
    std::vector<train_gpt::Document> train_docs, eval_docs;
    if (documents) {
      train_docs = train_gpt::split_documents(text.train, T + 1);
      eval_docs = train_gpt::split_documents(text.eval, T + 1);
      TORCH_CHECK(!train_docs.empty() && !eval_docs.empty(), "train_gpt: --pack/--pad found no documents in the text");
    }

    torch::manual_seed(seed);
    GPT model(cfg);
    model->to(device);
    ddp.broadcast_parameters(*model);
    // Each rank draws its own dropout masks; batches come from (seed, step) alone.
    torch::manual_seed(seed + static_cast<uint64_t>(ddp.rank()));
    std::vector<torch::Tensor> decay, no_decay;
    for (auto& p : model->named_parameters()) (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
    const std::vector<torch::optim::OptimizerParamGroup> groups = {
        torch::optim::OptimizerParamGroup(
            decay, std::make_unique<torch::optim::AdamWOptions>(
                       torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(weight_decay))),
        torch::optim::OptimizerParamGroup(no_decay,
                                          std::make_unique<torch::optim::AdamWOptions>(
                                              torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(0.0)))};
    // The same state either way: checkpoints of one load into the other.
    std::unique_ptr<torch::optim::AdamW> optimizer_owner = fused ? std::make_unique<train_gpt::FusedAdamW>(groups)
                                                                 : std::make_unique<torch::optim::AdamW>(groups);
    torch::optim::AdamW& opt = *optimizer_owner;

    int64_t start = 0;
    fs::create_directories(out_dir);
    const fs::path ckpt = fs::path(out_dir) / "checkpoint";
    if (!resume.empty()) {
      const fs::path from = fs::path(resume) / "checkpoint";
      std::ifstream meta(from / "step.txt");
      TORCH_CHECK(meta >> start, "train_gpt: --resume ", resume, ": no checkpoint there (",
                  (from / "step.txt").string(), ")");
      torch::load(model, (from / "model.pt").string(), device);
      torch::load(opt, (from / "optimizer.pt").string(), device);
      torch::Tensor rng;
      const fs::path rng_file = from / ("rng_rank" + std::to_string(ddp.rank()) + ".pt");
      TORCH_CHECK(fs::exists(rng_file), "train_gpt: --resume ", resume,
                  ": the checkpoint has no random state for rank ", ddp.rank(), " (", rng_file.string(),
                  "); resume with the world size it was saved with");
      torch::load(rng, rng_file.string());
      at::Generator default_gen = at::detail::getDefaultCPUGenerator();
      default_gen.set_state(rng);
      if (lead) fmt::print(stderr, "train_gpt: resumed from {} at step {}\n", from.string(), start);
    }
    // Written to checkpoint.tmp, then renamed: a crash while saving leaves the last
    // complete checkpoint. Every rank saves its random state (dropout); rank 0 the rest.
    auto save_checkpoint = [&](int64_t step) {
      const fs::path tmp = fs::path(out_dir) / "checkpoint.tmp";
      if (lead) {
        fs::remove_all(tmp);
        fs::create_directories(tmp);
      }
      ddp.average(0.0);  // a barrier: tmp exists before the other ranks write into it
      torch::save(at::detail::getDefaultCPUGenerator().get_state(),
                  (tmp / ("rng_rank" + std::to_string(ddp.rank()) + ".pt")).string());
      if (lead) {
        torch::save(model, (tmp / "model.pt").string());
        torch::save(opt, (tmp / "optimizer.pt").string());
        std::ofstream(tmp / "step.txt") << step << "\n";
      }
      ddp.average(0.0);  // every rank's state is in tmp
      if (lead) {
        fs::remove_all(ckpt);
        fs::rename(tmp, ckpt);
      }
    };
    auto eval_loss = [&] {
      torch::NoGradGuard no_grad;
      model->eval();
      double sum = 0;
      for (int64_t i = 0; i < eval_batches; ++i) {
        AutocastScope autocast(amp);
        if (documents) {
          const auto b = train_gpt::document_batch(text.eval, eval_docs, global, 0, global, seed + 1, i, true);
          sum += torch::cross_entropy_loss(model->forward_packed(b.inputs.to(device), b.positions.to(device),
                                                                 b.cu_seqlens.to(device)),
                                           b.targets.to(device))
                     .item<double>();
          continue;
        }
        auto [x, y] = batch(text.eval, T, global, 0, global, seed + 1, i);
        sum += torch::cross_entropy_loss(model(x.to(device)).view({-1, cfg.vocab_size}), y.to(device).view(-1))
                   .item<double>();
      }
      model->train();
      return sum / eval_batches;
    };

    const int64_t n_params = [&] {
      int64_t n = 0;
      for (auto& p : model->parameters()) n += p.numel();
      return n;
    }();
    if (lead) {
      if (documents) {
        fmt::print(stderr,
                   "train_gpt: {}; {} parameters; {} rank(s) x {} documents {} (at most {} bytes each); "
                   "{} thread(s) each\n",
                   text.source, n_params, ddp.world_size(), batch_size, pack ? "packed end to end" : "padded", T + 1,
                   at::get_num_threads());
        fmt::print(stderr, "train_gpt: training text: {}\n", train_gpt::length_summary(train_docs));
      } else {
        fmt::print(stderr, "train_gpt: {}; {} parameters; {} rank(s) x {} sequences of {} bytes; {} thread(s) each\n",
                   text.source, n_params, ddp.world_size(), batch_size, T, at::get_num_threads());
      }
      fmt::print(stderr, "train_gpt: uniform-guess loss ln(256) = {:.3f}\n", std::log(256.0));
      fmt::print(stderr, "train_gpt: device {}, {}\n", device.str(),
                 amp ? "bf16 autocast, float32 master weights" : "float32");
      fmt::print(stderr, "train_gpt: optimizer {}\n",
                 fused ? "fused (at::_fused_adamw_, foreach clip)" : "loop (torch::optim::AdamW, clip_grad_norm_)");
    }
    const fs::path csv_path = fs::path(out_dir) / "loss.csv";
    std::vector<std::string> kept;  // on resume, the rows up to the checkpoint's step
    if (start && lead) {
      std::ifstream old(csv_path);
      for (std::string line; std::getline(old, line);) {
        if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0])) && std::stoll(line) <= start) {
          kept.push_back(line);
        }
      }
    }
    std::ofstream csv;
    if (lead) {
      csv.open(csv_path.string(), std::ios::trunc);
      csv << "step,train_loss,eval_loss,lr,tokens_per_s\n";
      for (const auto& line : kept) csv << line << "\n";
    }
    Progress progress{steps};
    const auto t0 = std::chrono::steady_clock::now();
    double loss_avg = 0;
    int64_t useful_tokens = 0;
    model->train();
    for (int64_t step = start; step < steps; ++step) {
      if (step == die_at_step && ddp.rank() == die_rank) {
        fmt::print(stderr, "train_gpt rank {}: exiting abruptly at step {} (--die-at-step)\n", ddp.rank(), step);
        std::_Exit(3);
      }
      torch::Tensor loss;
      if (documents) {
        const auto b = train_gpt::document_batch(text.train, train_docs, global, ddp.rank() * batch_size, batch_size,
                                                 seed, step, pack);
        useful_tokens += b.useful;
        AutocastScope autocast(amp);
        const auto logits = pack ? model->forward_packed(b.inputs.to(device), b.positions.to(device),
                                                         b.cu_seqlens.to(device))
                                 : model(b.inputs.to(device)).view({-1, cfg.vocab_size});
        // The mean over the tokens with a target (cross_entropy's ignore_index -100).
        loss = torch::cross_entropy_loss(logits, b.targets.to(device).view(-1));
      } else {
        auto [x, y] = batch(text.train, T, global, ddp.rank() * batch_size, batch_size, seed, step);
        useful_tokens += global * T;
        AutocastScope autocast(amp);
        loss = torch::cross_entropy_loss(model(x.to(device)).view({-1, cfg.vocab_size}), y.to(device).view(-1));
      }
      opt.zero_grad();
      loss.backward();
      ddp.average_gradients(*model);
      if (fused) {
        train_gpt::clip_grad_norm(model->parameters(), clip);
      } else {
        torch::nn::utils::clip_grad_norm_(model->parameters(), clip);
      }
      const double step_lr = lr_at(step, steps, warmup, lr);
      for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(step_lr);
      opt.step();

      const double train_loss = ddp.average(loss.item<double>());
      loss_avg = step == start ? train_loss : 0.9 * loss_avg + 0.1 * train_loss;
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double tok_s = static_cast<double>(useful_tokens) / elapsed;
      const bool last = step + 1 == steps;
      double ev = NAN;
      // Every rank evaluates (the same batches): no rank waits on another's eval.
      if (last || (eval_every > 0 && (step + 1) % eval_every == 0)) ev = eval_loss();
      if (lead) {
        csv << fmt::format("{},{:g},{},{:g},{:g}\n", step + 1, train_loss,
                           std::isnan(ev) ? "" : fmt::format("{:f}", ev), step_lr, tok_s)
            << std::flush;  // a crash keeps the rows so far
        progress.show(step + 1, loss_avg, tok_s, elapsed / (step - start + 1) * (steps - step - 1));
        if (!std::isnan(ev)) {
          fmt::print(stderr, "{}step {}: train loss {:.4f}, eval loss {:.4f}\n", progress.tty ? "\n" : "", step + 1,
                     loss_avg, ev);
        }
      }
      if (save_every > 0 && (step + 1) % save_every == 0) save_checkpoint(step + 1);
    }
    if (lead) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print(stderr, "train_gpt: {} useful tokens in {:.1f} s ({:.0f} tokens/s); peak RSS {:.1f} MiB\n",
                 useful_tokens, seconds, static_cast<double>(useful_tokens) / seconds, peak_rss_mib());
    }
    save_checkpoint(steps);
    torchattn::save_state_dict(*model,
                               (fs::path(out_dir) / ("final_rank" + std::to_string(ddp.rank()) + ".pt")).string());
    if (lead && sample_tokens > 0) {
      torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
      std::vector<int64_t> p;
      for (unsigned char c : prompt) p.push_back(c);  // bytes are tokens 0..255
      auto out = model->generate(p, sample_tokens, temperature, top_k, gen);
      std::string s(prompt);
      for (auto b : out) s.push_back(static_cast<char>(b));
      fmt::print("---- sample (temperature {:.2f}, top-k {}, KV cache) ----\n{}\n----\n", temperature, top_k, s);
    }
  } catch (const c10::Error& e) {
    fmt::print(stderr, "\n{}\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
