// dtr-convert: model format conversions.
//   dtr-convert gguf-to-hf MODEL.gguf OUT_DIR
//       Hugging Face directory: config.json, model.safetensors (f32, dequantised, llama.cpp's
//       Q/K row permutation undone), tokenizer.json + tokenizer_config.json (with the chat
//       template of the GGUF) for a byte-level BPE tokenizer; without one (none in the GGUF, a
//       SentencePiece vocabulary) the model alone, and the closing line says why.
//   dtr-convert hf-to-gguf HF_DIR OUT.gguf [--outtype f32|f16|bf16]
//       GGUF file (llama architecture): llama.* hyper-parameters from config.json, the
//       tokenizer (tokenizer.ggml.*, chat template) from tokenizer.json / tokenizer_config.json,
//       tensors under llama.cpp names with the Q/K row permutation re-applied. 2-D weights as
//       --outtype (default f32), 1-D tensors (norms) F32; nothing is quantised.
//   dtr-convert merge-adapter BASE ADAPTER_DIR OUT_DIR
//       BASE is a GGUF file or an HF directory; ADAPTER_DIR a PEFT LoRA adapter (written by
//       dtr-train or by PEFT). Writes the merged model as an HF directory.
// Errors: one line "dtr-convert: error: ..." naming the file or key, exit code 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "models/transformer/convert.h"
#include "runtime/env.h"

int main(int argc, char** argv) {
  CLI::App app{"dtr-convert: GGUF <-> Hugging Face Llama checkpoints, merge a PEFT LoRA adapter into a base model"};
  app.require_subcommand(1);
  std::string in, adapter, out, outtype = "f32";
  auto* g2h = app.add_subcommand("gguf-to-hf", "GGUF file -> Hugging Face directory (f32, dequantised)");
  g2h->add_option("gguf", in, "input .gguf file")->required()->check(CLI::ExistingFile);
  g2h->add_option("out_dir", out, "output directory")->required();
  auto* h2g = app.add_subcommand("hf-to-gguf", "Hugging Face Llama directory -> GGUF file (f32 / f16 / bf16; not quantised)");
  h2g->add_option("hf_dir", in, "input directory: config.json, model.safetensors (or sharded + index), tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  h2g->add_option("out_gguf", out, "output .gguf file")->required();
  h2g->add_option("--outtype", outtype, "type of the 2-D weights (1-D norms stay f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  auto* merge = app.add_subcommand("merge-adapter", "base (GGUF or HF dir) + PEFT adapter -> merged HF directory");
  merge->add_option("base", in, "base model: .gguf file or HF directory")->required()->check(CLI::ExistingPath);
  merge->add_option("adapter_dir", adapter, "PEFT adapter directory")->required()->check(CLI::ExistingDirectory);
  merge->add_option("out_dir", out, "output directory")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    dtr::check_process_environment();
    if (*g2h) {
      const dtr::TokenizerFiles tok = dtr::convert_gguf_to_hf(in, out);
      std::printf("dtr-convert: wrote %s (config.json, model.safetensors%s%s)\n", out.c_str(),
                  tok.written ? ", tokenizer files" : "; no tokenizer files: ", tok.missing.c_str());
    } else if (*h2g) {
      dtr::convert_hf_to_gguf(in, out, dtr::parse_gguf_outtype(outtype));
      std::printf("dtr-convert: wrote %s (%s)\n", out.c_str(), outtype.c_str());
    } else {
      const auto adapted = dtr::merge_adapter_to_hf(in, adapter, out);
      std::printf("dtr-convert: merged %zu LoRA modules of %s into %s\n", adapted.size(), adapter.c_str(), out.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtr-convert: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
