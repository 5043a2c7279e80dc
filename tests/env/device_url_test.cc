#include "env/device_url.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpushim {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;

TEST(DeviceUrlTest, DefaultIsOneSimulatedDeviceWith16G) {
  const DeviceUrl url = DeviceUrl::Default();
  EXPECT_EQ(url.scheme, DeviceUrl::Scheme::kSim);
  EXPECT_EQ(url.devices, 1);
  EXPECT_EQ(url.hbm_bytes, 16 * kGiB);
  EXPECT_EQ(url.link_gbps, 0.0);
  EXPECT_EQ(url.latency_us, 0.0);
  EXPECT_EQ(url.dma_engines, 1);
  EXPECT_EQ(url.text, "sim://");
}

TEST(DeviceUrlTest, BareSimIsTheDefault) {
  const absl::StatusOr<DeviceUrl> url = ParseDeviceUrl("sim://");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->devices, 1);
  EXPECT_EQ(url->hbm_bytes, 16 * kGiB);
  EXPECT_EQ(url->dma_engines, 1);
  EXPECT_EQ(url->text, "sim://");
}

TEST(DeviceUrlTest, ParsesEveryParameter) {
  const std::string text =
      "sim://?devices=4&hbm=8G&link_gbps=25&latency_us=2.5&dma_engines=2";
  const absl::StatusOr<DeviceUrl> url = ParseDeviceUrl(text);
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->scheme, DeviceUrl::Scheme::kSim);
  EXPECT_EQ(url->devices, 4);
  EXPECT_EQ(url->hbm_bytes, 8 * kGiB);
  EXPECT_EQ(url->link_gbps, 25.0);
  EXPECT_EQ(url->latency_us, 2.5);
  EXPECT_EQ(url->dma_engines, 2);
  EXPECT_EQ(url->text, text);
}

TEST(DeviceUrlTest, ParsesAVfioUrlWithItsDefaults) {
  const absl::StatusOr<DeviceUrl> url =
      ParseDeviceUrl("vfio://0000:01:00.0?engine=nvme");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->scheme, DeviceUrl::Scheme::kVfio);
  EXPECT_EQ(url->pci_address.ToString(), "0000:01:00.0");
  EXPECT_EQ(url->engine, DeviceUrl::Engine::kNvme);
  EXPECT_EQ(url->d2d, DeviceUrl::D2d::kAuto);
  EXPECT_EQ(url->irq, DeviceUrl::Irq::kMsix);
  EXPECT_EQ(url->queue_depth, 256u);
}

TEST(DeviceUrlTest, ParsesEveryVfioParameter) {
  const absl::StatusOr<DeviceUrl> url = ParseDeviceUrl(
      "vfio://1f:1d.7?queue_depth=4096&irq=poll&d2d=bounce&engine=nvme");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->pci_address.domain, 0u);
  EXPECT_EQ(url->pci_address.bus, 0x1fu);
  EXPECT_EQ(url->pci_address.device, 0x1du);
  EXPECT_EQ(url->pci_address.function, 7u);
  EXPECT_EQ(url->pci_address.ToString(), "0000:1f:1d.7");
  EXPECT_EQ(url->d2d, DeviceUrl::D2d::kBounce);
  EXPECT_EQ(url->irq, DeviceUrl::Irq::kPoll);
  EXPECT_EQ(url->queue_depth, 4096u);
}

TEST(PciAddressTest, ParsesUpperAndLowerCaseHexAndADomain) {
  const absl::StatusOr<PciAddress> a = PciAddress::Parse("FFFF:Ab:1F.7");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ToString(), "ffff:ab:1f.7");
}

TEST(DeviceUrlTest, ParametersMayComeInAnyOrder) {
  const absl::StatusOr<DeviceUrl> url =
      ParseDeviceUrl("sim://?dma_engines=3&hbm=512MiB&devices=2");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->devices, 2);
  EXPECT_EQ(url->hbm_bytes, 512 * kMiB);
  EXPECT_EQ(url->dma_engines, 3);
}

TEST(DeviceUrlTest, AcceptsTheEndsOfEveryRange) {
  const absl::StatusOr<DeviceUrl> low = ParseDeviceUrl(
      "sim://?devices=1&hbm=1M&link_gbps=0&latency_us=0.0&dma_engines=1");
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_EQ(low->hbm_bytes, kMiB);
  const absl::StatusOr<DeviceUrl> high =
      ParseDeviceUrl("sim://?devices=64&hbm=1T&dma_engines=64");
  ASSERT_TRUE(high.ok()) << high.status();
  EXPECT_EQ(high->devices, 64);
  EXPECT_EQ(high->hbm_bytes, kTiB);
  EXPECT_EQ(high->dma_engines, 64);
  const absl::StatusOr<DeviceUrl> link_low =
      ParseDeviceUrl("sim://?link_gbps=0.001&latency_us=10000000");
  ASSERT_TRUE(link_low.ok()) << link_low.status();
  EXPECT_EQ(link_low->link_gbps, 0.001);
  EXPECT_EQ(link_low->latency_us, 1e7);
  const absl::StatusOr<DeviceUrl> link_high =
      ParseDeviceUrl("sim://?link_gbps=1000000");
  ASSERT_TRUE(link_high.ok()) << link_high.status();
  EXPECT_EQ(link_high->link_gbps, 1e6);
}

struct BadUrl {
  std::string url;
  // Words the message must contain (the parameter and the value, or the
  // scheme and the supported ones).
  std::vector<std::string> mentions;
};
void PrintTo(const BadUrl& c, std::ostream* os) { *os << '"' << c.url << '"'; }

class DeviceUrlRejectsTest : public ::testing::TestWithParam<BadUrl> {};

TEST_P(DeviceUrlRejectsTest, WithInvalidArgumentNamingTheCulprit) {
  const absl::StatusOr<DeviceUrl> url = ParseDeviceUrl(GetParam().url);
  ASSERT_FALSE(url.ok()) << "accepted " << GetParam().url;
  EXPECT_EQ(url.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& mention : GetParam().mentions) {
    EXPECT_THAT(std::string(url.status().message()), HasSubstr(mention));
  }
}

INSTANTIATE_TEST_SUITE_P(
    BadUrls, DeviceUrlRejectsTest,
    ::testing::Values(
        // Wrong or missing scheme.
        BadUrl{"nvme://0000:00:04.0", {"\"nvme://\"", "sim://, vfio://"}},
        // vfio://: the PCI address and the engine.
        BadUrl{"vfio://0000:00:04.0", {"engine=", "nvme"}},
        BadUrl{"vfio://0000:00:04.0?irq=poll", {"engine=", "nvme"}},
        BadUrl{"vfio://0000:00:04.0?engine=ahci", {"engine=\"ahci\"", "nvme"}},
        BadUrl{"vfio://?engine=nvme", {"PCI address=\"\"", "0000:01:00.0"}},
        BadUrl{"vfio://0000:00:20.0?engine=nvme",
               {"PCI address=\"0000:00:20.0\""}},
        BadUrl{"vfio://0000:100:00.0?engine=nvme",
               {"PCI address=\"0000:100:00.0\""}},
        BadUrl{"vfio://00:04.8?engine=nvme", {"PCI address=\"00:04.8\""}},
        BadUrl{"vfio://0000:00:04?engine=nvme", {"PCI address=\"0000:00:04\""}},
        BadUrl{"vfio://0000:0g:04.0?engine=nvme",
               {"PCI address=\"0000:0g:04.0\""}},
        BadUrl{"vfio://0000:00:04.0?engine=nvme&devices=2",
               {"unknown vfio:// parameter", "\"devices=2\"",
                "engine, d2d, irq, queue_depth"}},
        BadUrl{"vfio://0000:00:04.0?engine=nvme&engine=nvme",
               {"engine", "twice"}},
        BadUrl{"vfio://0000:00:04.0?engine=nvme&irq=intx",
               {"irq=\"intx\"", "msix, poll"}},
        BadUrl{"vfio://0000:00:04.0?engine=nvme&d2d=dma",
               {"d2d=\"dma\"", "auto, copy, bounce"}},
        BadUrl{"vfio://0000:00:04.0?engine=nvme&queue_depth=1",
               {"queue_depth=\"1\"", "[2, 4096]"}},
        BadUrl{"vfio://0000:00:04.0?engine=nvme&",
               {"vfio:// has an empty parameter"}},
        BadUrl{"http://sim", {"\"http://\"", "sim://"}},
        BadUrl{"SIM://", {"\"SIM://\"", "sim://"}},
        BadUrl{"sim:", {"\"sim:\"", "not a device URL", "sim://"}},
        BadUrl{"sim", {"\"sim\"", "sim://"}},
        BadUrl{"", {"not a device URL", "sim://"}},
        // Something between `//` and `?`.
        BadUrl{"sim://host", {"no host or path", "\"host\""}},
        BadUrl{"sim:///?devices=2", {"no host or path", "\"/\""}},
        // Malformed query.
        BadUrl{"sim://?", {"empty parameter"}},
        BadUrl{"sim://?devices=2&", {"empty parameter"}},
        BadUrl{"sim://?devices=2&&hbm=1G", {"empty parameter"}},
        BadUrl{"sim://?devices", {"\"devices\"", "has no value"}},
        // Unknown or repeated parameter.
        BadUrl{"sim://?foo=1", {"unknown", "\"foo=1\"", "devices, hbm"}},
        BadUrl{"sim://?Devices=2", {"unknown", "\"Devices=2\""}},
        BadUrl{"sim://?devices=2&devices=3",
               {"devices", "twice", "\"devices=2\"", "\"devices=3\""}},
        // Out of range.
        BadUrl{"sim://?devices=0", {"devices=\"0\"", "[1, 64]"}},
        BadUrl{"sim://?devices=65", {"devices=\"65\"", "[1, 64]"}},
        BadUrl{"sim://?dma_engines=0", {"dma_engines=\"0\"", "[1, 64]"}},
        BadUrl{"sim://?dma_engines=100", {"dma_engines=\"100\""}},
        BadUrl{"sim://?hbm=512K", {"hbm=\"512K\"", "[1M, 1T]"}},
        BadUrl{"sim://?hbm=2T", {"hbm=\"2T\"", "[1M, 1T]"}},
        // Malformed integers.
        BadUrl{"sim://?devices=", {"devices=\"\"", "empty"}},
        BadUrl{"sim://?devices=-1", {"devices=\"-1\""}},
        BadUrl{"sim://?devices=+2", {"devices=\"+2\""}},
        BadUrl{"sim://?devices=0x4", {"devices=\"0x4\""}},
        BadUrl{"sim://?devices=2 ", {"devices=\"2 \""}},
        BadUrl{"sim://?devices=18446744073709551616",
               {"devices=\"18446744073709551616\""}},
        // Malformed sizes.
        BadUrl{"sim://?hbm=16X", {"hbm=\"16X\"", "byte size"}},
        BadUrl{"sim://?hbm=16g", {"hbm=\"16g\""}},
        BadUrl{"sim://?hbm=G", {"hbm=\"G\""}},
        BadUrl{"sim://?hbm=", {"hbm=\"\""}},
        // Malformed floats.
        BadUrl{"sim://?link_gbps=1e3", {"link_gbps=\"1e3\""}},
        BadUrl{"sim://?link_gbps=-1", {"link_gbps=\"-1\""}},
        BadUrl{"sim://?link_gbps=inf", {"link_gbps=\"inf\""}},
        BadUrl{"sim://?link_gbps=nan", {"link_gbps=\"nan\""}},
        BadUrl{"sim://?link_gbps=1.", {"link_gbps=\"1.\""}},
        BadUrl{"sim://?link_gbps=.5", {"link_gbps=\".5\""}},
        BadUrl{"sim://?link_gbps=1.2.3", {"link_gbps=\"1.2.3\""}},
        BadUrl{"sim://?latency_us=", {"latency_us=\"\""}},
        BadUrl{"sim://?latency_us=+2", {"latency_us=\"+2\""}},
        BadUrl{"sim://?latency_us=2us", {"latency_us=\"2us\""}},
        // Link settings past what the link model can time: each named with
        // its value and the range it takes.
        BadUrl{"sim://?link_gbps=0.0000000000001",
               {"link_gbps=\"0.0000000000001\"", "out of range",
                "0 (unthrottled) or 0.001 to 1000000 Gb/s"}},
        BadUrl{"sim://?link_gbps=0.0009",
               {"link_gbps=\"0.0009\"", "0.001 to 1000000"}},
        BadUrl{"sim://?link_gbps=1000000.5",
               {"link_gbps=\"1000000.5\"", "0.001 to 1000000"}},
        BadUrl{"sim://?latency_us=10000000000000000",
               {"latency_us=\"10000000000000000\"", "out of range",
                "[0, 10000000] microseconds"}},
        BadUrl{"sim://?latency_us=10000000.1",
               {"latency_us=\"10000000.1\"", "[0, 10000000]"}}));

struct ByteSizeCase {
  std::string text;
  uint64_t bytes;
};
void PrintTo(const ByteSizeCase& c, std::ostream* os) {
  *os << '"' << c.text << '"';
}

class ByteSizeAcceptsTest : public ::testing::TestWithParam<ByteSizeCase> {};

TEST_P(ByteSizeAcceptsTest, Parses) {
  const absl::StatusOr<uint64_t> bytes = ParseByteSize(GetParam().text, "x");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, GetParam().bytes);
}

INSTANTIATE_TEST_SUITE_P(
    GoodSizes, ByteSizeAcceptsTest,
    ::testing::Values(
        ByteSizeCase{"0", 0}, ByteSizeCase{"4096", 4096},
        ByteSizeCase{"007", 7}, ByteSizeCase{"1K", kKiB},
        ByteSizeCase{"3KiB", 3 * kKiB}, ByteSizeCase{"512M", 512 * kMiB},
        ByteSizeCase{"512MiB", 512 * kMiB}, ByteSizeCase{"16G", 16 * kGiB},
        ByteSizeCase{"16GiB", 16 * kGiB}, ByteSizeCase{"2T", 2 * kTiB},
        ByteSizeCase{"2TiB", 2 * kTiB},
        ByteSizeCase{"16777215T", 16777215 * kTiB},
        ByteSizeCase{"18446744073709551615",
                     std::numeric_limits<uint64_t>::max()}));

class ByteSizeRejectsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ByteSizeRejectsTest, WithInvalidArgumentNamingTheValue) {
  const absl::StatusOr<uint64_t> bytes = ParseByteSize(GetParam(), "hbm");
  ASSERT_FALSE(bytes.ok()) << "accepted " << GetParam();
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bytes.status().message()),
              HasSubstr("hbm=\"" + GetParam() + "\""));
}

INSTANTIATE_TEST_SUITE_P(
    BadSizes, ByteSizeRejectsTest,
    ::testing::Values("", "G", "GiB", "16g", "16gib", "16Gi", "16GB", "16B",
                      "16 G", " 16G", "16G ", "-16G", "+16G", "1.5G", "0x10",
                      "1e9", "16P", "16777216T", "18446744073709551616"));

TEST(ParseDecimalTest, AcceptsDigitsWithLeadingZeros) {
  EXPECT_EQ(*ParseDecimal("0", "n"), 0u);
  EXPECT_EQ(*ParseDecimal("000123", "n"), 123u);
  EXPECT_EQ(*ParseDecimal("18446744073709551615", "n"),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*ParseDecimal("3", "n", 3, 3), 3u);
}

TEST(ParseDecimalTest, SaysWhyAValueIsNotANumber) {
  EXPECT_EQ(ParseDecimal("", "n").status().message(),
            "n=\"\" is not a valid decimal number: it is empty");
  EXPECT_EQ(ParseDecimal("12x", "n").status().message(),
            "n=\"12x\" is not a valid decimal number: only the digits 0-9 "
            "are allowed, found 'x' at offset 2");
  EXPECT_EQ(ParseDecimal("18446744073709551616", "n").status().message(),
            "n=\"18446744073709551616\" is not a valid decimal number: it is "
            "larger than 18446744073709551615");
  EXPECT_EQ(ParseDecimal("4", "n", 0, 3).status().message(),
            "n=\"4\" is out of range [0, 3]");
  EXPECT_EQ(ParseDecimal("0", "n", 1, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(InvalidValueErrorTest, QuotesTheValue) {
  const absl::Status status = InvalidValueError("X", " 1", "is bad");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "X=\" 1\" is bad");
}

TEST(WithUrlParameterTest, ReplacesInPlaceOrAppends) {
  EXPECT_EQ(WithUrlParameter("sim://", "devices", "2"), "sim://?devices=2");
  EXPECT_EQ(WithUrlParameter("sim://?hbm=8G", "devices", "2"),
            "sim://?hbm=8G&devices=2");
  EXPECT_EQ(WithUrlParameter("sim://?devices=4&hbm=8G", "devices", "2"),
            "sim://?devices=2&hbm=8G");
  // A parameter whose name only starts with `name` is another parameter.
  EXPECT_EQ(WithUrlParameter("sim://?link_gbps=25", "link", "1"),
            "sim://?link_gbps=25&link=1");
  // The result parses to what was set.
  absl::StatusOr<DeviceUrl> url = ParseDeviceUrl(
      WithUrlParameter("sim://?latency_us=2", "link_gbps", "12.5"));
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->link_gbps, 12.5);
  EXPECT_EQ(url->latency_us, 2.0);
}

}  // namespace
}  // namespace tpushim
