#include "common/status_macros.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

absl::Status ReturnIfError(absl::Status inner, int* reached) {
  TPUSHIM_RETURN_IF_ERROR(inner);
  ++*reached;
  return absl::OkStatus();
}

absl::Status ReturnIfErrorOnStatusOr(absl::StatusOr<int> inner, int* reached) {
  TPUSHIM_RETURN_IF_ERROR(inner);
  ++*reached;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorPassesOkThrough) {
  int reached = 0;
  EXPECT_TRUE(ReturnIfError(absl::OkStatus(), &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheError) {
  int reached = 0;
  const absl::Status s =
      ReturnIfError(absl::ResourceExhaustedError("full"), &reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "full");
  EXPECT_EQ(reached, 0);
}

TEST(StatusMacrosTest, ReturnIfErrorAcceptsStatusOr) {
  int reached = 0;
  EXPECT_TRUE(ReturnIfErrorOnStatusOr(7, &reached).ok());
  EXPECT_EQ(ReturnIfErrorOnStatusOr(absl::NotFoundError("x"), &reached).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reached, 1);
}

absl::StatusOr<std::unique_ptr<int>> MakeInt(absl::Status status, int v) {
  if (!status.ok()) return status;
  return std::make_unique<int>(v);
}

absl::StatusOr<int> AddOne(absl::Status status, int v) {
  TPUSHIM_ASSIGN_OR_RETURN(std::unique_ptr<int> p, MakeInt(status, v));
  return *p + 1;
}

absl::StatusOr<int> AssignTwiceToExisting() {
  std::unique_ptr<int> p;
  TPUSHIM_ASSIGN_OR_RETURN(p, MakeInt(absl::OkStatus(), 1));
  TPUSHIM_ASSIGN_OR_RETURN(p, MakeInt(absl::OkStatus(), *p + 10));
  return *p;
}

TEST(StatusMacrosTest, AssignOrReturnMovesMoveOnlyValues) {
  absl::StatusOr<int> v = AddOne(absl::OkStatus(), 41);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 42);
}

TEST(StatusMacrosTest, AssignOrReturnReturnsTheError) {
  absl::StatusOr<int> v = AddOne(absl::InvalidArgumentError("bad"), 41);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(), "bad");
}

TEST(StatusMacrosTest, AssignOrReturnWorksTwiceInOneScopeOnExistingLvalue) {
  absl::StatusOr<int> v = AssignTwiceToExisting();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 11);
}

TEST(StatusMacrosTest, ArgumentsAreEvaluatedOnce) {
  int calls = 0;
  auto f = [&]() -> absl::StatusOr<int> {
    ++calls;
    return 3;
  };
  auto g = [&]() -> absl::StatusOr<int> {
    TPUSHIM_ASSIGN_OR_RETURN(int x, f());
    TPUSHIM_RETURN_IF_ERROR(f());
    return x;
  };
  EXPECT_EQ(*g(), 3);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace tpushim
