#pragma once
// The world sizes a suite is written for.
//
//   KSHARD_SUITE_WORLD_SIZES(1);        // at namespace scope, in any file of the suite
//
// Launched at another size, the suite runs no case: every rank prints one
// line naming the sizes it runs at and the launch exits 2. Without a
// declaration a suite runs at any size (its cases skip what their mesh
// cannot have). Declarations in several files of one suite intersect.
#include <initializer_list>
#include <vector>

namespace kshard::testing {

/// Registers a declaration (what KSHARD_SUITE_WORLD_SIZES expands to).
struct SuiteWorldSizes {
  SuiteWorldSizes(std::initializer_list<int> sizes);
};

/// The sizes declared so far, intersected; empty when none was declared.
/// `declared` tells the two "empty" cases apart.
std::vector<int> suite_world_sizes(bool* declared = nullptr);

}  // namespace kshard::testing

#define KSHARD_SUITE_WORLD_SIZES(...)                                                     \
  static const ::kshard::testing::SuiteWorldSizes KSHARD_WS_CAT_(kshard_world_sizes_,     \
                                                                 __LINE__) {              \
    __VA_ARGS__                                                                           \
  }
#define KSHARD_WS_CAT_(a, b) KSHARD_WS_CAT2_(a, b)
#define KSHARD_WS_CAT2_(a, b) a##b
