#include "env/mapping_facts.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * kKiB;

const void* At(uint64_t a) { return reinterpret_cast<const void*>(a); }

// One mapping's smaps entry.
std::string Entry(uint64_t begin, uint64_t end, uint64_t rss_kb,
                  uint64_t anon_huge_kb, uint64_t locked_kb,
                  uint64_t page_kb, uint64_t hugetlb_kb,
                  const std::string& flags) {
  return absl::StrFormat(
      "%x-%x rw-p 00000000 00:00 0 \n"
      "Size:           %8d kB\n"
      "KernelPageSize: %8d kB\n"
      "MMUPageSize:    %8d kB\n"
      "Rss:            %8d kB\n"
      "AnonHugePages:  %8d kB\n"
      "Shared_Hugetlb:        0 kB\n"
      "Private_Hugetlb:%8d kB\n"
      "Locked:         %8d kB\n"
      "THPeligible:    1\n"
      "VmFlags: %s\n",
      begin, end, (end - begin) / kKiB, page_kb, page_kb, rss_kb,
      anon_huge_kb, hugetlb_kb, locked_kb, flags);
}

TEST(MappingFactsTest, SumsTheMappingsOfTheRange) {
  // The region split in two mappings (as mlock or mbind of part of it
  // does), between two unrelated ones.
  const std::string smaps =
      Entry(0x1000, 0x3000, 8, 0, 0, 4, 0, "rd wr mr mw me ac sd") +
      Entry(0x40000000, 0x40400000, 4096, 4096, 4096, 4, 0,
            "rd wr mr mw me lo ac sd hg") +
      Entry(0x40400000, 0x40800000, 4096, 2048, 4096, 4, 0,
            "rd wr mr mw me lo ac sd hg") +
      Entry(0x50000000, 0x50001000, 4, 0, 0, 4, 0, "rd wr");
  absl::StatusOr<MappingFacts> f =
      ParseMappingFacts(smaps, At(0x40000000), 8 * kMiB);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->mappings, 2);
  EXPECT_EQ(f->mapped_bytes, 8 * kMiB);
  EXPECT_EQ(f->resident_bytes, 8 * kMiB);
  EXPECT_EQ(f->anon_huge_bytes, 6 * kMiB);
  EXPECT_EQ(f->locked_bytes, 8 * kMiB);
  EXPECT_EQ(f->kernel_page_bytes, 4 * kKiB);
  EXPECT_TRUE(f->huge_advised);
  EXPECT_TRUE(f->lock_flag);
  EXPECT_FALSE(f->hugetlb_flag);
  EXPECT_FALSE(f->no_huge_advised);
}

TEST(MappingFactsTest, AFlagCountsOnlyWhenEveryMappingHasIt) {
  const std::string smaps =
      Entry(0x40000000, 0x40200000, 2048, 0, 0, 4, 0, "rd wr hg") +
      Entry(0x40200000, 0x40400000, 2048, 0, 0, 4, 0, "rd wr");
  absl::StatusOr<MappingFacts> f =
      ParseMappingFacts(smaps, At(0x40000000), 4 * kMiB);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->huge_advised);
}

TEST(MappingFactsTest, APartlyCoveredMappingCountsItsShare) {
  const std::string smaps =
      Entry(0x40000000, 0x40400000, 4096, 4096, 2048, 4, 0, "rd wr");
  absl::StatusOr<MappingFacts> f =
      ParseMappingFacts(smaps, At(0x40100000), 2 * kMiB);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->mapped_bytes, 2 * kMiB);
  EXPECT_EQ(f->anon_huge_bytes, 2 * kMiB);
  EXPECT_EQ(f->locked_bytes, 1 * kMiB);
}

TEST(MappingFactsTest, HugetlbMappings) {
  const std::string smaps =
      Entry(0x40000000, 0x40800000, 0, 0, 0, 2048, 8192, "rd wr lo ht");
  absl::StatusOr<MappingFacts> f =
      ParseMappingFacts(smaps, At(0x40000000), 8 * kMiB);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kernel_page_bytes, 2 * kMiB);
  EXPECT_EQ(f->hugetlb_bytes, 8 * kMiB);
  EXPECT_TRUE(f->hugetlb_flag);
  EXPECT_TRUE(f->lock_flag);
}

TEST(MappingFactsTest, ARangeNoMappingCoversIsAnError) {
  const std::string smaps = Entry(0x1000, 0x3000, 8, 0, 0, 4, 0, "rd");
  EXPECT_EQ(ParseMappingFacts(smaps, At(0x40000000), kMiB).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseMappingFacts("", At(0x1000), 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseMappingFacts("Rss: 4 kB\n", At(0x1000), 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MappingFactsTest, ReadsThisProcessForReal) {
  const size_t n = 4 * kMiB;
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(madvise(p, n, MADV_NOHUGEPAGE), 0);
  std::memset(p, 1, n / 2);  // half of it resident
  absl::StatusOr<MappingFacts> f = ReadMappingFacts(*Os::Default(), p, n);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->mapped_bytes, n);
  EXPECT_EQ(f->resident_bytes, n / 2);
  EXPECT_EQ(f->anon_huge_bytes, 0u);
  EXPECT_EQ(f->kernel_page_bytes, 4 * kKiB);
  EXPECT_TRUE(f->no_huge_advised);
  EXPECT_FALSE(f->huge_advised);
  munmap(p, n);
}

}  // namespace
}  // namespace tpushim
