//! The crate's integration tests as one test binary: each module is one file of tests
//! (linking a binary per file took most of a clean build's time).

mod agent_loop;
mod chat_branches;
mod chat_one_write;
mod chat_turns;
mod common;
mod compaction;
mod compaction_settings;
mod concurrent_items;
mod conversations;
mod estimates;
mod executor_flags;
mod executor_hooks;
mod executor_http;
mod executor_props;
mod executor_resume;
mod executor_tools_budgets;
mod fit_read_back;
mod fitting_off;
mod forked_states;
mod hook_programs;
mod host_programs;
mod mcp_servers;
mod render_workers;
mod storage;
mod subworkflows;
mod system_role;
mod turn_queue;
mod workflow_files;
