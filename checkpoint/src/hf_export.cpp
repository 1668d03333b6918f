#include "kshard/checkpoint/hf_export.hpp"

#include <fstream>

#include "hf_layout.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/agree.hpp"
#include "safetensors_layout.hpp"

namespace kshard {
namespace fs = std::filesystem;

void export_hf(FsdpModel& model, const HfConfig& config, const fs::path& dir, DType dtype) {
  const Communicator& world = model.mesh().world();
  const bool root = world.rank() == 0;
  run_agreed(world, [&] {
    detail::check_hf_model(model, config, "export_hf");
    if (root) fs::create_directories(dir);
  });
  detail::write_safetensors(model, dir / "model.safetensors", dtype,
                            {{"kshard.hf_model_type", config.model_type}},
                            [&](std::size_t u, const ParamEntry& e) {
                              return detail::hf_pieces(config, u, e, "export_hf");
                            });
  agree_ok(world, run_local([&] {
    if (!root) return;
    const fs::path tmp = dir / "config.json.partial";
    {
      std::ofstream f(tmp);
      f << detail::hf_config_json(config, dtype).dump(2) << "\n";
      if (!f.flush()) throw Error("cannot write " + tmp.string(), "a writable directory");
    }
    fs::rename(tmp, dir / "config.json");
  }));
}

}  // namespace kshard
