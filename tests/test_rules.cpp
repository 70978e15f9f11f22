// The crawler's rules tables (data/crawl/*.json) are consistent: every name they use is defined.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "opforge/core/paths.h"
#include "test_support.h"

using nlohmann::json;

namespace {
json load(const std::string& name) {
  auto path = opforge::data_dir() / "crawl" / name;
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}
}  // namespace

TEST(Rules, TorchLayoutsReferToDefinedInputsAndSizes) {
  json r = load("torch.json");
  for (auto& [k, v] : r["sizes"].items()) {
    ASSERT_TRUE(v.is_number_integer()) << k;
    EXPECT_GT(v.get<int>(), 0) << k;
  }
  for (auto& [layout, inputs] : r["layouts"].items())
    for (auto& in : inputs) EXPECT_TRUE(r["inputs"].contains(in.get<std::string>())) << layout << " uses " << in;
}

TEST(Rules, EveryRuleNamesAKnownLayout) {
  json r = load("torch.json");
  auto known = [&](const json& rule) {
    return !rule.contains("layout") || rule.contains("inputs") || r["layouts"].contains(rule["layout"].get<std::string>());
  };
  for (auto& [cls, rule] : r["nn"]["classes"].items()) EXPECT_TRUE(known(rule)) << "nn." << cls;
  for (auto& [fn, rule] : r["functional"]["functions"].items()) EXPECT_TRUE(known(rule)) << "F." << fn;
  std::set<std::string> names;
  for (auto& g : r["torch"]["groups"]) {
    EXPECT_TRUE(known(g)) << g["category"];
    for (auto& op : g["ops"]) {
      json rule = op.is_string() ? json{{"name", op}} : op;
      EXPECT_TRUE(known(rule)) << rule.dump();
      std::string qual = g["namespace"].get<std::string>() + "." + rule["name"].get<std::string>();
      EXPECT_TRUE(names.insert(qual).second) << qual << " is listed twice";
      if (rule.contains("call")) EXPECT_NE(rule["call"].get<std::string>().find("{fn}"), std::string::npos) << qual;
    }
  }
  EXPECT_GT(names.size(), 300u);
}

TEST(Rules, TransformersPatternsCompileAndConfigIsTiny) {
  json r = load("transformers.json");
  for (auto& p : r["class_patterns"]) EXPECT_NO_THROW(std::regex(p[0].get<std::string>())) << p;
  for (auto& p : r["exclude_patterns"]) EXPECT_NO_THROW(std::regex(p.get<std::string>())) << p;
  // One layer, a small hidden size: seeds must probe in milliseconds on a CPU.
  EXPECT_EQ(r["config"]["num_hidden_layers"], 1);
  EXPECT_LE(r["sizes"]["hidden_size"].get<int>(), 128);
  for (auto& key : {"config", "init_args", "forward_main", "forward_args", "max_classes_per_family"})
    EXPECT_TRUE(r.contains(key)) << key;
}
