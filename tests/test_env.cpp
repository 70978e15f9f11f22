// opforge env export / check: the agent's working folders, through the real binary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace opforge;

namespace {

bool writable(const fs::path& p) {
  return (fs::status(p).permissions() & fs::perms::owner_write) != fs::perms::none;
}

std::map<std::string, std::string> tree(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) files[fs::relative(e.path(), root).string()] = test::read_file(e.path());
  return files;
}

}  // namespace

TEST(Env, ExportWritesTheCudaAgentLayoutWithProtectedFilesAndTheSameBytesTwice) {
  test::TempDir d;
  fs::path tasks = test::fixtures() / "eval" / "tasks";
  auto r = test::run_opforge({"env", "export", "--tasks", tasks.string(), "--out", (d / "a").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, (d / "a" / "manifest.json").string() + "\n");
  json m = json::parse(test::read_file(d / "a" / "manifest.json"));
  size_t n_tasks = 0;  // one workdir per fixture task
  for (auto& e : fs::directory_iterator(tasks)) n_tasks += e.path().extension() == ".py";
  ASSERT_EQ(m["tasks"].size(), n_tasks) << m.dump();
  ASSERT_GE(n_tasks, 3u);
  fs::path w = d / "a" / "linear_relu";
  EXPECT_EQ(test::read_file(w / "model.py"), test::read_file(tasks / "linear_relu.py"));
  for (auto rel : {"model.py", "SKILL.md", "binding.cpp", "binding_registry.h", "utils/verification.py",
                   "utils/profiling.py", "utils/compile.sh", "utils/judge.py", "utils/task.json"}) {
    ASSERT_TRUE(fs::is_regular_file(w / rel)) << rel;
    EXPECT_FALSE(writable(w / rel)) << rel << " should be read-only";
  }
  EXPECT_TRUE(writable(w / "model_new.py"));
  EXPECT_TRUE(fs::is_directory(w / "kernels"));
  EXPECT_NE(test::read_file(w / "SKILL.md").find("linear_relu"), std::string::npos);
  EXPECT_NE(test::read_file(w / "SKILL.md").find("more than 5% faster than `torch.compile`"), std::string::npos);
  auto entry = std::find_if(m["tasks"].begin(), m["tasks"].end(),
                            [](const json& t) { return t["name"] == "linear_relu"; });
  ASSERT_NE(entry, m["tasks"].end()) << m.dump();
  EXPECT_EQ(json::parse(test::read_file(w / "utils" / "task.json"))["task_id"], (*entry)["task_id"]);
  auto again = test::run_opforge({"env", "export", "--tasks", tasks.string(), "--out", (d / "b").string()});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(tree(d / "a"), tree(d / "b"));
}

TEST(Env, CheckFindsEveryProtectedFileTheAgentChanged) {
  test::TempDir d;
  auto r = test::run_opforge({"env", "export", "--tasks", (test::fixtures() / "eval" / "tasks").string(), "--out",
                              d.path().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ok = test::run_opforge({"env", "check", "--out", d.path().string()});
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_EQ(ok.out, "");
  fs::path w = d / "linear_relu";
  test::write_file(w / "model_new.py", "# the agent's own file: not checked\n");
  fs::permissions(w / "model.py", fs::perms::owner_write, fs::perm_options::add);  // as the agent can
  test::write_file(w / "model.py", "class Model: pass\n");
  fs::remove(w / "utils" / "judge.py");
  fs::remove(w / "SKILL.md");
  fs::create_symlink(d / ".protected" / "linear_relu" / "SKILL.md", w / "SKILL.md");  // same bytes, a link
  auto bad = test::run_opforge({"env", "check", "--out", d.path().string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.out, "linear_relu/model.py\nlinear_relu/SKILL.md\nlinear_relu/utils/judge.py\n") << bad.err;
}

TEST(Env, BadInputsAreClearErrors) {
  test::TempDir d;
  auto none = test::run_opforge({"env", "export", "--tasks", (d / "nothing").string(), "--out", (d / "o").string()});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("nothing"), std::string::npos) << none.err;
  auto check = test::run_opforge({"env", "check", "--out", (d / "o").string(), "some_task"});
  EXPECT_EQ(check.exit_code, 1);
  EXPECT_NE(check.err.find("opforge env export first"), std::string::npos) << check.err;
}
