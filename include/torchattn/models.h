#pragma once

// torchattn's models component (CMake target torchattn::models): Hugging Face model
// folders as LibTorch modules.
//
//   #include <torchattn/models.h>
//   auto lm = torchattn::models::LanguageModel::from_pretrained("SmolLM2-135M-Instruct");
//   auto encoder = torchattn::models::SentenceEncoder::from_pretrained("all-MiniLM-L6-v2");
//   torchattn::models::Seq2SeqLM bart(torchattn::models::read_bart_config("bart/config.json"));

#include <torchattn/models/bert.h>
#include <torchattn/models/causal_lm.h>
#include <torchattn/models/chat.h>
#include <torchattn/models/config.h>
#include <torchattn/models/engine.h>
#include <torchattn/models/folder_checks.h>
#include <torchattn/models/generation.h>
#include <torchattn/models/gguf_model.h>
#include <torchattn/models/language_model.h>
#include <torchattn/models/load_options.h>
#include <torchattn/models/perplexity.h>
#include <torchattn/models/rms_norm.h>
#include <torchattn/models/saved_folder.h>
#include <torchattn/models/sampler.h>
#include <torchattn/models/sentence_encoder.h>
#include <torchattn/models/seq2seq_generation.h>
#include <torchattn/models/seq2seq_lm.h>
#include <torchattn/models/tokenizer.h>
#include <torchattn/models/weights.h>
