#include "kshard/engine/nn/sub_layers.hpp"

#include "kshard/error.hpp"

namespace kshard {

template <class T>
SubLayers<T>::SubLayers(std::initializer_list<Part> parts) : parts_(parts) {
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j)
      if (parts_[j].name == parts_[i].name)
        throw Error("sub-layer name '" + parts_[i].name + "' given twice", "distinct names");
    const std::size_t n = parts_[i].layer->param_specs().size();
    ranges_.push_back({total_, n});
    total_ += n;
  }
}

template <class T>
std::vector<ParamSpec> SubLayers<T>::specs() const {
  std::vector<ParamSpec> out;
  out.reserve(total_);
  for (const Part& p : parts_)
    for (ParamSpec s : p.layer->param_specs()) {
      if (!p.name.empty()) s.name = p.name + "." + s.name;
      out.push_back(std::move(s));
    }
  return out;
}

template <class T>
template <class Views>
Views SubLayers<T>::slice(std::string_view name, const Views& all) const {
  if (all.size() != total_)
    throw Error("sub-layer '" + std::string(name) + "' sliced from " +
                    std::to_string(all.size()) + " Views",
                std::to_string(total_) + " (one per parameter of the composite)");
  for (std::size_t i = 0; i < parts_.size(); ++i)
    if (parts_[i].name == name)
      return Views(all.begin() + std::ptrdiff_t(ranges_[i].first),
                   all.begin() + std::ptrdiff_t(ranges_[i].first + ranges_[i].count));
  std::string known;
  for (const Part& p : parts_) known += (known.empty() ? "'" : ", '") + p.name + "'";
  throw Error("no sub-layer named '" + std::string(name) + "'", "one of " + known);
}

template <class T>
typename SubLayers<T>::ConstViews SubLayers<T>::params(std::string_view name,
                                                       const ConstViews& all) const {
  return slice(name, all);
}

template <class T>
typename SubLayers<T>::GradViews SubLayers<T>::grads(std::string_view name,
                                                     const GradViews& all) const {
  return slice(name, all);
}

template <class T>
void SubLayers<T>::set_fp8_policy(const Fp8Policy& policy) {
  for (Part& p : parts_) p.layer->set_fp8_policy(policy);
}

template <class T>
void SubLayers<T>::fp8_scales(std::vector<Fp8Scale*>& out) {
  for (Part& p : parts_) p.layer->fp8_scales(out);
}

template <class T>
bool SubLayers<T>::assigns_grads() const {
  for (const Part& p : parts_)
    if (!p.layer->assigns_grads()) return false;
  return true;
}

template <class T>
void SubLayers<T>::set_grad_write(GradWrite w) {
  for (Part& p : parts_) p.layer->set_grad_write(w);
}

#define KSHARD_INSTANTIATE_SUB_LAYERS(T) template class SubLayers<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_SUB_LAYERS)
#undef KSHARD_INSTANTIATE_SUB_LAYERS

}  // namespace kshard
