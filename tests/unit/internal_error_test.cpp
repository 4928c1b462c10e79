// The two kinds of failure (core/error.h): MT_CHECK's InvalidArgument, a
// meshtrain::Error that the commands report and the fuzzers accept as a clear
// rejection; and MT_ASSERT's InternalError, a bug in meshtrain, which is no
// meshtrain::Error, so that neither mistakes it for the input's fault.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "../../fuzz/fuzz_input.h"
#include "core/dtype.h"
#include "core/error.h"
#include "test_util.h"

using namespace meshtrain;
using mtest::contains;

namespace {

void check_positive(int x) { MT_CHECK(x > 0, "x must be positive, got {}", x); }

void assert_positive(int x) { MT_ASSERT(x > 0, "x was {}", x); }
constexpr int kAssertLine = __LINE__ - 1;

}  // namespace

TEST(InternalError, AssertThrowsInternalErrorNamingPlaceAndCondition) {
  static_assert(!std::is_base_of_v<Error, InternalError>);
  static_assert(std::is_base_of_v<std::logic_error, InternalError>);
  EXPECT_NO_THROW(assert_positive(1));
  EXPECT_THROW(assert_positive(0), InternalError);
  bool caught_as_error = false, caught_as_internal = false;
  try {
    try {
      assert_positive(-2);
    } catch (const Error&) {
      caught_as_error = true;
    }
  } catch (const InternalError& e) {
    caught_as_internal = true;
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, fmt::format("internal error at {}:{}", __FILE__, kAssertLine))) << what;
    EXPECT_TRUE(contains(what, "internal_error_test.cpp:")) << what;
    EXPECT_TRUE(contains(what, "(x > 0)")) << what;
    EXPECT_TRUE(contains(what, "x was -2")) << what;
  }
  EXPECT_FALSE(caught_as_error);
  EXPECT_TRUE(caught_as_internal);
}

TEST(InternalError, CheckThrowsInvalidArgumentWithTheMessageAlone) {
  EXPECT_NO_THROW(check_positive(1));
  EXPECT_THROW(check_positive(0), InvalidArgument);
  try {
    check_positive(-3);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const Error& e) {  // a user error: caught as meshtrain::Error
    EXPECT_STREQ(e.what(), "x must be positive, got -3");
  }
}

// A converted check: a DType that is none of its enumerators comes only from
// a cast in meshtrain's own code.
TEST(InternalError, InvalidDTypeCodeIsAnInternalError) {
  EXPECT_THROW(dtype_size(static_cast<DType>(99)), InternalError);
}

// The fuzzers' harness accepts meshtrain::Error as a clear rejection of a bad
// input, and lets everything else escape (the fuzzer then reports a crash).
TEST(InternalError, FuzzHarnessSwallowsUserErrorsOnly) {
  EXPECT_NO_THROW(fuzz::expect_result_or_clear_error([] { check_positive(0); }));
  EXPECT_NO_THROW(fuzz::expect_result_or_clear_error([] { throw CommError("ranks disagree"); }));
  EXPECT_NO_THROW(fuzz::expect_result_or_clear_error([] { assert_positive(1); }));
  EXPECT_THROW(fuzz::expect_result_or_clear_error([] { assert_positive(0); }), InternalError);
  EXPECT_THROW(fuzz::expect_result_or_clear_error([] { throw std::out_of_range("map::at"); }), std::out_of_range);
}
