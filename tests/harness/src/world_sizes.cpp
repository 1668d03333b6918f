#include "kshard/testing/world_sizes.hpp"

#include <algorithm>

namespace kshard::testing {
namespace {

struct Declared {
  bool any = false;
  std::vector<int> sizes;
};

// Function-local: declarations are static objects of other translation
// units, constructed in no defined order relative to this one.
Declared& declared() {
  static Declared d;
  return d;
}

}  // namespace

SuiteWorldSizes::SuiteWorldSizes(std::initializer_list<int> sizes) {
  Declared& d = declared();
  std::vector<int> mine(sizes);
  std::sort(mine.begin(), mine.end());
  mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  if (!d.any) {
    d.sizes = mine;
  } else {
    std::vector<int> both;
    std::set_intersection(d.sizes.begin(), d.sizes.end(), mine.begin(), mine.end(),
                          std::back_inserter(both));
    d.sizes = both;
  }
  d.any = true;
}

std::vector<int> suite_world_sizes(bool* was_declared) {
  if (was_declared) *was_declared = declared().any;
  return declared().sizes;
}

}  // namespace kshard::testing
