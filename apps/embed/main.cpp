// torchattn_embed: sentence embeddings of texts with a Hugging Face encoder folder
// (model_type bert: BERT, MiniLM, ...), as sentence-transformers' encode.
//
//   torchattn_embed --model DIR [TEXT ...] [--file F] [--format jsonl|npy] [--output F]
//                   [--batch-size N] [--truncate] [--device cpu|cuda] [--dtype float32|bfloat16|int8|dynamic-int8|int4]
//
// Texts come from the arguments, or from --file (one per line; "-" is stdin), or
// from stdin when neither is given. JSON lines (one array of floats per text, in
// order) or a NumPy .npy file of float32 [texts, dimension].

#include "cli_checks.h"
#include "fmt.h"
#include "npy.h"

#include <torchattn/models.h>

#include <CLI/CLI.hpp>
#include <torch/cuda.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <unistd.h>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::vector<std::string> read_lines(std::istream& in) {
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

void write_jsonl(std::FILE* out, const at::Tensor& rows_in) {
  const at::Tensor rows = rows_in.cpu().contiguous();
  const float* v = rows.const_data_ptr<float>();
  const int64_t n = rows.size(0), d = rows.size(1);
  std::string line;
  for (int64_t i = 0; i < n; ++i) {
    line.assign("[");
    for (int64_t j = 0; j < d; ++j) fmt::format_to(std::back_inserter(line), "{}{}", j ? ", " : "", v[i * d + j]);
    line += "]\n";
    std::fwrite(line.data(), 1, line.size(), out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sentence embeddings of texts with a Hugging Face BERT-family folder on torchattn"};
  std::string model_dir, file, format = "jsonl", output, device_name = "cpu", dtype_name = "float32";
  std::vector<std::string> texts;
  int64_t batch_size = 32;
  bool truncate = false, quiet = false;
  app.add_option("--model", model_dir, "a Hugging Face encoder folder (model_type bert)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("texts", texts, "texts to embed (else --file, else stdin, one per line)");
  auto* file_opt = app.add_option("--file", file, "read texts from this file, one per line ('-': stdin)");
  app.option_defaults()->always_capture_default();
  app.add_option("--format", format, "jsonl (one JSON array per text) or npy (a NumPy float32 [texts, dimension])")
      ->check(CLI::IsMember({"jsonl", "npy"}));
  app.add_option("--output", output, "write here instead of stdout")->default_str("stdout");
  app.add_option("--batch-size", batch_size, "texts per forward")->check(apps::at_least(1));
  app.add_flag("--truncate", truncate, "cut texts longer than the model's max length (else: an error)");
  app.add_option("--device", device_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", dtype_name, "the weights' format on the CPU: float32, bfloat16, int8, dynamic-int8 or int4")
      ->check(CLI::IsMember({"float32", "bfloat16", "int8", "dynamic-int8", "int4"}))
      ->capture_default_str();
  app.add_flag("--quiet", quiet, "no progress line on stderr");
  CLI11_PARSE(app, argc, argv);

  try {
    if (device_name == "cuda" && dtype_name != "float32") {
      throw std::runtime_error("--dtype " + dtype_name + ": bfloat16, int8 and int4 weights run on the CPU only");
    }
    if (!texts.empty() && file_opt->count() > 0)
      throw std::runtime_error("give texts as arguments or --file, not both");
    // Where the texts came from: "" (the arguments), a file's name, or "stdin".
    std::string origin;
    if (texts.empty()) {
      origin = file_opt->count() > 0 && file != "-" ? file : "stdin";
      if (file_opt->count() > 0 && file != "-") {
        std::ifstream in(file);
        if (!in) throw std::runtime_error("--file: cannot open '" + file + "'");
        texts = read_lines(in);
      } else {
        texts = read_lines(std::cin);
      }
      if (texts.empty()) throw std::runtime_error("no texts: give them as arguments, with --file, or on stdin");
    }
    if (format == "npy" && output.empty() && isatty(fileno(stdout))) {
      throw std::runtime_error("--format npy: pass --output FILE (or redirect stdout); a terminal gets no binary");
    }
    if (device_name == "cuda" && !torch::cuda::is_available()) {
      throw std::runtime_error("--device cuda: this LibTorch sees no CUDA device");
    }
    auto encoder = [&] {
      try {
        return torchattn::models::SentenceEncoder::from_pretrained(
            model_dir, torchattn::models::LoadOptions()
                           .device(torch::Device(device_name))
                           .weight_format(torchattn::weight_format_from_string(dtype_name)));
      } catch (const c10::Error& e) {
        throw std::runtime_error(std::string("--model: ") + e.what_without_backtrace());
      }
    }();
    // Text i as the user gave it: "text 2" (the second argument), "line 7 of notes.txt".
    auto where = [&](size_t i) {
      return origin.empty() ? fmt::format("text {}", i + 1) : fmt::format("line {} of {}", i + 1, origin);
    };
    // Tokenized here rather than in SentenceEncoder::embed, so that the errors name the
    // text as given and this program's flags (the library's name its C++ options).
    const auto& tokenizer = encoder.tokenizer();
    std::vector<std::vector<int64_t>> ids(texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      if (const auto bad = torchattn::models::find_invalid_utf8(texts[i])) {
        throw std::runtime_error(fmt::format("{} is not valid UTF-8: the byte 0x{:02X} at offset {} (texts must be "
                                             "UTF-8)",
                                             where(i), static_cast<unsigned char>(texts[i][*bad]), *bad));
      }
      if (truncate) {
        ids[i] = tokenizer.encode(texts[i], true, encoder.max_length());
        continue;
      }
      ids[i] = tokenizer.encode(texts[i]);
      if (static_cast<int64_t>(ids[i].size()) > encoder.max_length()) {
        throw std::runtime_error(fmt::format("{} has {} tokens, more than the model's max_length of {}; shorten it, "
                                             "or pass --truncate to keep its first {} tokens",
                                             where(i), ids[i].size(), encoder.max_length(), encoder.max_length()));
      }
    }
    const bool progress = !quiet && static_cast<int64_t>(texts.size()) > batch_size;
    auto options = torchattn::models::EmbedOptions().batch_size(batch_size);
    if (progress) {
      options.on_progress([](int64_t done, int64_t all) {
        fmt::print(stderr, "\r[embedded {} of {} texts]{}", done, all, done == all ? "\n" : "");
      });
    }
    const at::Tensor rows = encoder.embed_ids(ids, options);
    std::FILE* out = output.empty() ? stdout : std::fopen(output.c_str(), "wb");
    if (out == nullptr) throw std::runtime_error("--output: cannot write '" + output + "'");
    if (format == "npy") {
      std::ostringstream bytes;
      write_npy(bytes, rows);
      const std::string b = bytes.str();
      std::fwrite(b.data(), 1, b.size(), out);
    } else {
      write_jsonl(out, rows);
    }
    if (out != stdout && std::fclose(out) != 0) throw std::runtime_error("--output: writing '" + output + "' failed");
    return 0;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "torchattn_embed: {}\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    fmt::print(stderr, "torchattn_embed: {}\n", e.what());
  }
  return 1;
}
