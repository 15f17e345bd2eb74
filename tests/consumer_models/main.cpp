#include <torchattn/models.h>

#include <iostream>

int main(int argc, char** argv) {
  namespace models = torchattn::models;
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " DECODER_FOLDER ENCODER_FOLDER\n";
    return 2;
  }
  try {
    // A decoder folder (llama, qwen2, mistral): text in, text out.
    auto lm = models::LanguageModel::from_pretrained(argv[1]);
    auto answers = lm.generate({lm.chat_prompt("What is the capital of France?")},
                               models::GenerationOptions().max_new_tokens(32));
    std::cout << answers[0].text << "\n";
    // An encoder folder (bert): sentence embeddings, L2-normalized rows.
    auto encoder = models::SentenceEncoder::from_pretrained(argv[2]);
    at::Tensor e = encoder.embed({"A man is eating food.", "A man is eating pasta."});
    std::cout << "cosine similarity: " << (e[0] * e[1]).sum().item<double>() << "\n";
  } catch (const c10::Error& e) {  // a folder that is not there, or not a model's
    std::cerr << e.what_without_backtrace() << "\n";
    return 1;
  }
}
