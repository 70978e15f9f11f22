// The agent's tools (agent/README.md, "Tools"): their OpenAI definitions and their execution in a
// working folder. Internal to the agent stage.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace opforge::agent {

struct ToolContext {
  std::filesystem::path folder;        // the working folder (the host's path)
  std::vector<std::string> ro;         // host paths the bash sandbox sees read-only
  std::map<std::string, std::string> env;  // the bash sandbox's PATH and the like
  double bash_timeout_s = 300;
  std::size_t output_chars = 16000;
  bool no_sandbox = false;
  std::function<std::string(const std::string&)> judge;  // a relayed request line -> its answer line
  // What the relayed requests were answered (hash, reward, reason, flags), for the bash call's record.
  std::shared_ptr<std::vector<nlohmann::json>> judged = std::make_shared<std::vector<nlohmann::json>>();
};

struct ToolOutcome {
  std::string content;  // what the model reads as the tool's answer
  bool ok = true;       // false: the call itself was wrong (unknown tool, bad arguments, refused path)
  bool submit = false;  // the episode ends here
  nlohmann::json detail = nlohmann::json::object();  // exit code, timed_out, bytes, judge requests
};

// The `tools` array of a chat-completions request.
nlohmann::json tool_definitions();

// One tool call: name and its arguments as the model wrote them (a JSON object in a string).
ToolOutcome call_tool(const ToolContext& ctx, const std::string& name, const std::string& arguments);

// The files a submission of the folder carries: all but model.py, SKILL.md, utils/, dot files,
// __pycache__ and build products (as utils/judge.py sends them), path -> text. Bounded, because
// the agent owns the folder: past `max_bytes` in all or `max_files`, or at a file or folder it
// made unreadable or that is not UTF-8 text, reading stops and `problem` says why (the episode's -1, not the run's crash).
struct SolutionFiles {
  nlohmann::json files = nlohmann::json::object();
  std::string problem;  // empty: the files are the whole solution
};
SolutionFiles solution_files(const std::filesystem::path& folder, std::size_t max_bytes = 1 << 20,
                             std::size_t max_files = 256);

}  // namespace opforge::agent
