#include "models/formats/hf_checkpoint.h"

#include <filesystem>

#include "models/transformer/gguf_names.h"
#include "tensor/error.h"

namespace dtr {

HFCheckpoint load_hf_checkpoint(const std::string& dir, safetensors::LoadMode mode) {
  HFCheckpoint c;
  c.config = load_model_config(dir);
  c.state_dict = safetensors::load_checkpoint(dir, mode);
  for (const auto& [name, t] : c.state_dict) {
    const Shape want = expected_shape(name, c.config);
    DTR_CHECK(want.empty() || t.sizes() == want, dir, ": tensor '", name, "' has shape ", t.sizes(),
              " but config.json needs ", want);
  }
  return c;
}

void save_hf_checkpoint(const HFCheckpoint& ckpt, const std::string& dir, uint64_t max_shard_bytes) {
  std::filesystem::create_directories(dir);
  safetensors::TensorMap sd = ckpt.state_dict;
  if (ckpt.config.tie_word_embeddings) sd.erase("lm_head.weight");
  safetensors::save_sharded(sd, dir, max_shard_bytes, {{"format", "pt"}});
  save_model_config(ckpt.config, (std::filesystem::path(dir) / "config.json").string());
}

}  // namespace dtr
