// Shards of an array job: `--shard I/N` splits one stage's work into N disjoint parts that N
// machines (or processes) do apart, in their own workspaces, later joined by `opforge merge`.
//
// Which part a task belongs to depends only on its id (xxh3 of the id, modulo N), so every shard
// of every stage agrees on it without talking to the others.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

namespace opforge {

struct Shard {
  int index = 0, count = 1;  // this shard is index of count (0 <= index < count); 0/1: everything
};

// Parses "I/N" (0 <= I < N). Throws opforge::Error naming --shard and the expected form.
Shard parse_shard(const std::string& spec);
// Whether the task with this id belongs to the shard: xxh3_64(task_id) % count == index.
bool in_shard(const std::string& task_id, Shard shard);
// A stage's completion marker of a shard in a workspace: WORKSPACE/done/STAGE.shard-I-of-N.json,
// the name the launchers' scripts look for (data/launchers/shard.sh).
std::filesystem::path shard_marker(const std::filesystem::path& workspace, std::string_view stage, Shard shard);

}  // namespace opforge
