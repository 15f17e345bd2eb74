// torchattn_embed_bench: sentences per second of SentenceEncoder::embed at batch 1
// (one call per sentence) and batch 32 (one call for 32 sentences), on the sentences
// apps/bench/peers/sentence_transformers_embed.py measured sentence-transformers' encode on
// (one per line), medians of repeated runs. apps/bench/embed/report_embed.py sets them side
// by side. Measured twice in one run: as loaded by default (the linear layers'
// weights packed for oneDNN) and with LoadOptions().pack_weights(false).
//
//   torchattn_embed_bench --model DIR --sentences FILE [--threads 2] [--json out.json] [--quick]

#include "fmt.h"

#include <torchattn/models.h>

#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SentenceEncoder::embed throughput at batch 1 and batch 32"};
  std::string model_dir, sentences_path, json_path;
  int threads = 2;
  bool quick = false;
  app.add_option("--model", model_dir, "an encoder folder")->required()->check(CLI::ExistingDirectory);
  app.add_option("--sentences", sentences_path, "the sentences, one per line")->required()->check(CLI::ExistingFile);
  app.add_option("--threads", threads, "intra-op threads");
  app.add_option("--json", json_path, "write the results here as JSON");
  app.add_flag("--quick", quick, "a smoke run");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);

  std::vector<std::string> sentences;
  std::ifstream in(sentences_path);
  for (std::string line; std::getline(in, line);) sentences.push_back(line);
  if (sentences.size() < 32) {
    fmt::print(stderr, "torchattn_embed_bench: expected at least 32 sentences in {}\n", sentences_path);
    return 1;
  }
  const std::vector<std::string> batch(sentences.begin(), sentences.begin() + 32);
  const size_t singles = std::min<size_t>(sentences.size(), quick ? 16 : 64);
  // Sentences per second at batch 1 and batch 32 (medians).
  auto measure = [&](torchattn::models::SentenceEncoder& encoder) {
    (void)encoder.embed(batch);  // warm-up
    std::vector<double> one, many;
    for (int r = 0; r < (quick ? 2 : 5); ++r) {
      const auto t = Clock::now();
      for (size_t i = 0; i < singles; ++i) (void)encoder.embed({sentences[i]});
      one.push_back(singles / std::chrono::duration<double>(Clock::now() - t).count());
    }
    for (int r = 0; r < (quick ? 2 : 7); ++r) {
      const auto t = Clock::now();
      (void)encoder.embed(batch);
      many.push_back(32 / std::chrono::duration<double>(Clock::now() - t).count());
    }
    return std::pair{median(one), median(many)};
  };
  // The default (weights packed for oneDNN), then the same folder with pack_weights(false).
  auto encoder = torchattn::models::SentenceEncoder::from_pretrained(model_dir);
  const auto [one, many] = measure(encoder);
  auto unpacked_encoder = torchattn::models::SentenceEncoder::from_pretrained(
      model_dir, torchattn::models::LoadOptions().pack_weights(false));
  const auto [one_unpacked, many_unpacked] = measure(unpacked_encoder);
  fmt::print("torchattn_embed_bench: {} threads: batch 1 {:.1f} sentences/s, batch 32 {:.1f} sentences/s; with "
             "pack_weights(false): {:.1f} and {:.1f}\n",
             at::get_num_threads(), one, many, one_unpacked, many_unpacked);
  if (!json_path.empty()) {
    std::ofstream(json_path) << fmt::format("{{\"tool\": \"torchattn\", \"threads\": {}, \"batch1_per_s\": {:.3f}, "
                                            "\"batch32_per_s\": {:.3f}, \"unpacked_batch1_per_s\": {:.3f}, "
                                            "\"unpacked_batch32_per_s\": {:.3f}}}\n",
                                            at::get_num_threads(), one, many, one_unpacked, many_unpacked);
  }
  return 0;
}
