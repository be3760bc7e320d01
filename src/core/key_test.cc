#include "idem/key.h"

#include <gtest/gtest.h>

#include "idem/canonical_json.h"

namespace idem {
namespace {

std::string KeyOf(std::string turn, std::string tool, std::string_view args,
                  KeyMode mode = KeyMode::kTurn) {
  auto fp = Fingerprint(args);
  EXPECT_TRUE(fp) << fp.error().ToString();
  auto k = DeriveKey(KeyInput{mode, std::move(turn), std::move(tool), *fp, std::nullopt});
  EXPECT_TRUE(k) << k.error().ToString();
  return k->key;
}

TEST(KeyTest, SameCallGivesSameKeyWhateverTheSpelling) {
  const std::string k = KeyOf("t1", "charge", R"({"amount":1,"to":"é"})");
  EXPECT_EQ(k, KeyOf("t1", "charge", R"({ "to" : "\u00e9", "amount" : 1.0 })"));
  EXPECT_EQ(k, KeyOf("t1", "charge", "{\n\t\"to\": \"\xc3\xa9\",\"amount\":1e0}"));
}

TEST(KeyTest, DifferentTurnToolOrArgumentsGiveDifferentKeys) {
  const std::string k = KeyOf("t1", "charge", R"({"id":12345678901234567891})");
  EXPECT_NE(k, KeyOf("t2", "charge", R"({"id":12345678901234567891})"));
  EXPECT_NE(k, KeyOf("t1", "refund", R"({"id":12345678901234567891})"));
  EXPECT_NE(k, KeyOf("t1", "charge", R"({"id":12345678901234567892})"));
}

TEST(KeyTest, SeparatorsInPartsAreUnambiguous) {
  EXPECT_NE(KeyOf("a:b", "c", "{}"), KeyOf("a", "b:c", "{}"));
  EXPECT_NE(KeyOf("a.b", "c", "{}"), KeyOf("a", "b.c", "{}"));
  EXPECT_NE(KeyOf("a%2Eb", "c", "{}"), KeyOf("a.b", "c", "{}"));
  EXPECT_NE(KeyOf("~abc", "c", "{}"), KeyOf(std::string(300, 'x'), "c", "{}"));
}

TEST(KeyTest, KeysAreVersionedVisibleAsciiAndBounded) {
  for (const std::string& turn :
       {std::string("t"), std::string(1000, '.'), std::string("turn with spaces\n\xff")}) {
    for (const std::string& tool : {std::string("charge"), std::string(500, '/')}) {
      std::string k = KeyOf(turn, tool, R"({"a":1})");
      EXPECT_TRUE(k.starts_with("v1t."));
      EXPECT_LE(k.size(), kMaxKeyBytes);
      EXPECT_TRUE(ValidateKey(k)) << k;
    }
  }
}

TEST(KeyTest, ModesProduceDistinctKeys) {
  const std::string turn = KeyOf("t1", "create_user", R"({"email":"a@b"})", KeyMode::kTurn);
  const std::string args = KeyOf("t1", "create_user", R"({"email":"a@b"})", KeyMode::kArgs);
  EXPECT_TRUE(args.starts_with("v1a."));
  EXPECT_NE(turn, args);
  EXPECT_EQ(args, KeyOf("t2", "create_user", R"({"email":"a@b"})", KeyMode::kArgs))
      << "args mode ignores the turn";
}

TEST(KeyTest, MissingTurnFallsBackToArgsMode) {
  auto fp = Fingerprint("{}");
  auto k = DeriveKey(KeyInput{KeyMode::kTurn, "", "charge", *fp, std::nullopt});
  ASSERT_TRUE(k);
  EXPECT_TRUE(k->turn_fallback);
  EXPECT_EQ(k->mode, KeyMode::kArgs);
  EXPECT_TRUE(k->key.starts_with("v1a."));
}

TEST(KeyTest, ExplicitKeyWinsAndIsValidated) {
  auto fp = Fingerprint("{}");
  auto k = DeriveKey(KeyInput{KeyMode::kTurn, "t", "charge", *fp, std::string("order-17")});
  ASSERT_TRUE(k);
  EXPECT_EQ(k->key, "order-17");
  EXPECT_EQ(k->mode, KeyMode::kExplicit);
  for (std::string bad : {std::string(""), std::string(256, 'k'), std::string("has space"),
                          std::string("caf\xc3\xa9")}) {
    auto r = DeriveKey(KeyInput{KeyMode::kTurn, "t", "charge", *fp, bad});
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  }
  auto missing = DeriveKey(KeyInput{KeyMode::kExplicit, "t", "charge", *fp, std::nullopt});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("requires an explicit idempotency key"),
            std::string::npos);
}

TEST(KeyTest, FieldsModeKeysOnTheBusinessKeyOnly) {
  auto a = FingerprintFields(R"({"email":"a@b","name":"Ann"})", {"/email"});
  auto b = FingerprintFields(R"({"name":"Anne","email":"a@b"})", {"/email"});
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, *b);
  auto c = FingerprintFields(R"({"email":"c@d"})", {"/email"});
  EXPECT_NE(*a, *c);
}

}  // namespace
}  // namespace idem
