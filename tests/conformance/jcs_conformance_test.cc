// The RFC 8785 (JCS) conformance vectors of tests/conformance/jcs/ against
// idem::Canonicalize, in both profiles (lenient, and strict I-JSON). The
// vectors are data kept in the repository (their provenance is in
// jcs/README.md); this file is their checker.
//
//   cyberphone  input/*.json -> output/*.json, byte for byte
//   extra       extra/vectors.jsonl: "canon" cases (exactly `expected`) and
//               "reject" cases (an error); `only` limits a case to a profile
//   numbers     numbers/*.csv rows "<ieee754 hex>,<expected>": the double,
//               written as a JSON literal, canonicalizes to `expected`
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "idem/canonical_json.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

const fs::path kVectors = IDEM_JCS_VECTORS_DIR;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Bytes from hex digits; whitespace between bytes is skipped (outhex/ writes
// "5b 35 36", the vectors' input_hex "5b3536").
std::string FromHex(std::string_view hex) {
  std::string bytes;
  std::string digits;
  for (char c : hex) {
    if (std::isxdigit(static_cast<unsigned char>(c))) digits.push_back(c);
  }
  for (size_t i = 0; i + 1 < digits.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

std::vector<fs::path> FilesIn(const fs::path& dir, std::string_view extension) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == extension) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

CanonOptions Profile(bool strict) {
  CanonOptions options;
  options.strict = strict;
  return options;
}

class JcsConformance : public ::testing::TestWithParam<bool> {};

TEST_P(JcsConformance, CyberphoneInputsCanonicalizeToTheirOutputsByteForByte) {
  const auto inputs = FilesIn(kVectors / "cyberphone" / "input", ".json");
  ASSERT_EQ(inputs.size(), 6u);
  for (const fs::path& input : inputs) {
    const std::string name = input.stem().string();
    const std::string expected = ReadFile(kVectors / "cyberphone" / "output" / (name + ".json"));
    ASSERT_EQ(expected, FromHex(ReadFile(kVectors / "cyberphone" / "outhex" / (name + ".txt"))))
        << "output/ and outhex/ disagree for " << name;
    const Result<std::string> got = Canonicalize(ReadFile(input), Profile(GetParam()));
    ASSERT_TRUE(got.has_value()) << name << ": " << got.error().message;
    EXPECT_EQ(*got, expected) << name;
  }
}

TEST_P(JcsConformance, ExtraVectorsAreCanonicalizedOrRejectedAsRecorded) {
  const bool strict = GetParam();
  std::ifstream in(kVectors / "extra" / "vectors.jsonl");
  ASSERT_TRUE(in);
  int checked = 0;
  for (std::string line; std::getline(in, line);) {
    const boost::json::object v = boost::json::parse(line).as_object();
    const std::string id(v.at("id").as_string());
    if (const auto* only = v.if_contains("only")) {
      if (*only == (strict ? "lenient" : "strict")) continue;
    }
    const std::string input = v.contains("input_hex")
                                  ? FromHex(v.at("input_hex").as_string())
                                  : std::string(v.at("input").as_string());
    const Result<std::string> got = Canonicalize(input, Profile(strict));
    if (v.at("kind") == "canon") {
      ASSERT_TRUE(got.has_value()) << id << ": " << got.error().message;
      EXPECT_EQ(*got, std::string(v.at("expected").as_string())) << id;
    } else {
      EXPECT_FALSE(got.has_value()) << id << ": accepted as " << *got;
    }
    ++checked;
  }
  // The counts jcs/README.md gives for each profile: a vector file that lost
  // lines fails here rather than passing with less.
  EXPECT_EQ(checked, strict ? 143 : 142);
}

// Writes `d` as a JSON number literal: "%.17g" on even rows and the shortest
// round-trip form on odd rows, so both spellings of every value are read.
std::string Literal(double d, size_t row) {
  char buf[64];
  if (row % 2 == 0) {
    std::snprintf(buf, sizeof buf, "%.17g", d);
    return buf;
  }
  const auto end = std::to_chars(buf, buf + sizeof buf, d).ptr;
  return std::string(buf, end);
}

TEST_P(JcsConformance, EveryNumberVectorCanonicalizesToItsEcmaScriptString) {
  size_t rows = 0;
  size_t failures = 0;
  for (const fs::path& file : FilesIn(kVectors / "numbers", ".csv")) {
    std::ifstream in(file);
    ASSERT_TRUE(in) << file;
    size_t line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      const size_t comma = line.find(',');
      if (comma == 0 || comma == std::string::npos) continue;
      const std::string hex = line.substr(0, comma);
      if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) continue;  // header
      const size_t end = line.find(',', comma + 1);
      const std::string expected = line.substr(comma + 1, end - comma - 1);
      const double d = std::bit_cast<double>(std::stoull(hex, nullptr, 16));
      if (!std::isfinite(d)) continue;
      const std::string literal = Literal(d, rows++);
      const Result<std::string> got = Canonicalize(literal, Profile(GetParam()));
      if (!got.has_value() || *got != expected) {
        if (++failures <= 20) {
          ADD_FAILURE() << file.filename().string() << ":" << line_no << ": " << literal
                        << " gave " << (got ? *got : "error " + got.error().message)
                        << ", want " << expected;
        }
      }
    }
  }
  EXPECT_EQ(failures, 0u);
  // jcs/README.md: 64,469 rows; the non-finite ones are not JSON.
  EXPECT_GT(rows, 64000u);
}

INSTANTIATE_TEST_SUITE_P(Profiles, JcsConformance, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Strict" : "Lenient"; });

}  // namespace
}  // namespace idem
