// The C ABI's chip query (1.4: Chips_List): every chip of the host with
// its holder, the array contract (capacity, num_chips), and bad arguments.

#include <unistd.h>

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpushim/c_api.h"

namespace {

using ::testing::HasSubstr;

const TpuShim_Api* Api() { return TpuShim_GetApi(); }

std::string Take(TpuShim_Error* error, int* code) {
  *code = Api()->Error_Code(error);
  std::string message = Api()->Error_Message(error);
  Api()->Error_Destroy(error);
  return message;
}

const TpuShim_Option kTwoChips[] = {{"TPUSHIM_DEVICE", "sim://?devices=2"},
                                    {"TPU_PREMAPPED_BUFFER_SIZE", "0"},
                                    {"TPU_LOG_DIR", "disabled"}};

TEST(CApiChipsTest, ListsEveryChipWithItsHolder) {
  ASSERT_TRUE(TPUSHIM_API_HAS(Api(), Chips_List));
  const TpuShim_Option visible[] = {
      kTwoChips[0], kTwoChips[1], kTwoChips[2], {"TPU_VISIBLE_CHIPS", "1"}};
  TpuShim_System_Create_Args create = {};
  create.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
  create.options = visible;
  create.num_options = 4;
  ASSERT_EQ(Api()->System_Create(&create), nullptr);

  TpuShim_ChipInfo chips[4];
  TpuShim_Chips_List_Args list = {};
  list.struct_size = TPUSHIM_CHIPS_LIST_ARGS_STRUCT_SIZE;
  list.options = kTwoChips;
  list.num_options = 3;
  list.chips = chips;
  list.capacity = 4;
  ASSERT_EQ(Api()->Chips_List(&list), nullptr);
  ASSERT_EQ(list.num_chips, 2u);
  EXPECT_EQ(chips[0].host_chip, 0);
  EXPECT_EQ(chips[0].held, 0);
  EXPECT_EQ(chips[0].pid, 0);
  EXPECT_STREQ(chips[0].name, "sim chip 0");
  EXPECT_EQ(chips[1].host_chip, 1);
  EXPECT_EQ(chips[1].held, 1);
  EXPECT_EQ(chips[1].pid, getpid());
  EXPECT_GT(chips[1].since_unix_us, 0);
  EXPECT_THAT(std::string(chips[1].command_line),
              HasSubstr("c_api_chips_test"));

  // A smaller array: the first chips, and the count of all.
  list.capacity = 1;
  std::memset(chips, 0x7f, sizeof(chips));
  ASSERT_EQ(Api()->Chips_List(&list), nullptr);
  EXPECT_EQ(list.num_chips, 2u);
  EXPECT_EQ(chips[0].host_chip, 0);
  EXPECT_EQ(chips[1].host_chip, 0x7f7f7f7f);  // untouched

  TpuShim_System_Destroy_Args destroy = {};
  destroy.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
  destroy.system = create.system;
  ASSERT_EQ(Api()->System_Destroy(&destroy), nullptr);
  list.capacity = 4;
  ASSERT_EQ(Api()->Chips_List(&list), nullptr);
  EXPECT_EQ(chips[1].held, 0);
}

TEST(CApiChipsTest, BadArgumentsAreInvalidArgument) {
  TpuShim_Chips_List_Args list = {};
  list.struct_size = TPUSHIM_CHIPS_LIST_ARGS_STRUCT_SIZE;
  list.capacity = 2;  // and no array
  int code = 0;
  EXPECT_THAT(Take(Api()->Chips_List(&list), &code), HasSubstr("chips"));
  EXPECT_EQ(code, TPUSHIM_CODE_INVALID_ARGUMENT);
  list.capacity = 0;
  const TpuShim_Option bad[] = {{"TPU_VISIBLE_CHIPS", "1,1"}};
  list.options = bad;
  list.num_options = 1;
  EXPECT_THAT(Take(Api()->Chips_List(&list), &code),
              HasSubstr("TPU_VISIBLE_CHIPS=\"1,1\""));
  EXPECT_EQ(code, TPUSHIM_CODE_INVALID_ARGUMENT);
  list.struct_size = 8;
  EXPECT_NE(Take(Api()->Chips_List(&list), &code), "");
  EXPECT_EQ(code, TPUSHIM_CODE_INVALID_ARGUMENT);
}

}  // namespace
