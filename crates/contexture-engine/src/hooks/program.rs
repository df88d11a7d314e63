//! Hook programs: a hook that is a program on this host, for callers who are not Rust code
//! (the CLI's `--hook`, a workflow's `hooks`, the server operator's configuration).
//!
//! At each point it is called for, the program is started with one JSON object on standard
//! input: `point` (the point's name) and the point's payload, messages in the OpenAI chat
//! format:
//!
//! | point | payload | the answer may hold |
//! |---|---|---|
//! | `on_step_enter` | `step`, `task` (text or null) | `task`: the step's task (text or null) |
//! | `before_llm_call` | `call`, `messages` | one of `view` (messages sent for this call only), `append` or `replace` (a change recorded in the execution's thread) |
//! | `after_llm_call` | `call`, `reply` (one message) | `reply`: the message the step goes on with |
//! | `on_step_exit` | `step`, `output` (text) | `output`: the text stored as the step's output |
//! | `before_compaction` | `compaction` | `skip`: true skips the compaction |
//! | `after_compaction` | `compaction`, `report` | nothing |
//!
//! An empty answer, or `{}`, changes nothing. Anything else (a program that cannot start,
//! exits non-zero, answers past its timeout, prints what is not a JSON object, or names a key
//! the point does not take) is a [`HookError`] that fails the step, with the start of the
//! program's standard error when it exited non-zero.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use contexture_core::Message;
use contexture_core::format::openai;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{
    BeforeCall, CallInfo, CompactionInfo, HistoryChange, Hook, HookError, HookPoint, StepInfo,
};
use crate::tools::{confine_environment, stderr_excerpt};
use contexture_core::compact::CompactionReport;

/// How long a hook program may take to answer unless its declaration says otherwise.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// The most a hook program may write on standard output: a view holds a whole request.
const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;

/// A hook program as configuration declares it (a workflow's `hooks`, the server's
/// `hooks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookProgramSpec {
    /// The program and its arguments, as given (no shell, no templates).
    pub command: Vec<String>,
    /// The points it is called at; none means every point.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<HookPoint>,
    /// How long it may take to answer, in seconds (30 unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// With a value, the program sees only these environment variables (and `PATH`), never
    /// those of the process that runs it; without, it inherits them (the CLI's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<BTreeMap<String, String>>,
}

impl HookProgramSpec {
    /// A program called at every point with no arguments, inheriting the environment (the
    /// CLI's `--hook PROGRAM`).
    pub fn program(program: impl Into<String>) -> HookProgramSpec {
        HookProgramSpec {
            command: vec![program.into()],
            points: Vec::new(),
            timeout_seconds: None,
            environment: None,
        }
    }

    /// What is wrong with the declaration, as `(key, problem)` pairs; none when it is valid.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        match self.command.first() {
            None => problems.push(("command", "is empty: name a program".to_owned())),
            Some(program) if program.trim().is_empty() => {
                problems.push(("command", "names no program (an empty string)".to_owned()));
            }
            Some(_) => {}
        }
        if let Some(seconds) = self.timeout_seconds
            && !(seconds > 0.0 && seconds.is_finite() && seconds <= 86_400.0)
        {
            problems.push((
                "timeout_seconds",
                format!("is {seconds}: give a number of seconds above 0, at most 86400"),
            ));
        }
        problems
    }
}

/// A program called at hook points (see the module documentation for what it reads and
/// answers).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramHook {
    name: String,
    argv: Vec<String>,
    points: BTreeSet<HookPoint>,
    timeout: Duration,
    environment: Option<BTreeMap<String, String>>,
}

impl ProgramHook {
    /// The hook `spec` declares, or what is wrong with it (`key: problem`).
    pub fn new(spec: HookProgramSpec) -> Result<ProgramHook, String> {
        if let Some((key, problem)) = spec.problems().into_iter().next() {
            return Err(format!("{key} {problem}"));
        }
        Ok(ProgramHook {
            name: spec.command.join(" "),
            points: spec.points.into_iter().collect(),
            timeout: spec
                .timeout_seconds
                .map_or(DEFAULT_HOOK_TIMEOUT, Duration::from_secs_f64),
            environment: spec.environment,
            argv: spec.command,
        })
    }

    /// True when the program is called at `point`.
    pub fn is_called_at(&self, point: HookPoint) -> bool {
        self.points.is_empty() || self.points.contains(&point)
    }

    /// Calls the program at `point` with `payload` (an object the point's name is added
    /// to) and returns its answer: `None` for an empty answer or `{}`, else the object,
    /// with every key checked against `keys`.
    fn ask(
        &self,
        point: HookPoint,
        mut payload: Map<String, Value>,
        keys: &[&str],
    ) -> Result<Option<Map<String, Value>>, HookError> {
        if !self.is_called_at(point) {
            return Ok(None);
        }
        payload.insert("point".into(), Value::from(point.as_str()));
        let input = Value::Object(payload).to_string();
        let output = off_the_runtime(|| self.run(input.as_bytes()))?;
        let text = String::from_utf8(output)
            .map_err(|_| HookError::new("it answered with output that is not UTF-8"))?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        let answer: Value = serde_json::from_str(&text).map_err(|error| {
            HookError::new(format!(
                "its answer is not valid JSON (line {}, column {}): {error}",
                error.line(),
                error.column()
            ))
        })?;
        let Value::Object(answer) = answer else {
            return Err(HookError::new(format!(
                "its answer is {}, not an object",
                contexture_core::format::json_type(&answer)
            )));
        };
        if let Some(key) = answer.keys().find(|key| !keys.contains(&key.as_str())) {
            return Err(HookError::new(format!(
                "its answer to {point} has the unknown key `{key}` ({})",
                if keys.is_empty() {
                    "this point takes no answer: print nothing or {}".to_owned()
                } else {
                    format!("it may hold {}", quoted(keys))
                }
            )));
        }
        Ok((!answer.is_empty()).then_some(answer))
    }

    /// Runs the program once with `input` on standard input; its standard output when it
    /// exits with success within the timeout.
    fn run(&self, input: &[u8]) -> Result<Vec<u8>, HookError> {
        let (program, arguments) = self
            .argv
            .split_first()
            .ok_or_else(|| HookError::new("its command is empty"))?;
        let mut command = Command::new(program);
        command
            .args(arguments)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(environment) = &self.environment {
            confine_environment(&mut command, environment);
        }
        let mut child = command
            .spawn()
            .map_err(|error| HookError::new(format!("cannot start `{program}`: {error}")))?;
        // Written and read on threads of their own: a program that answers before it has
        // read all its input (or writes much to standard error) must not stall the other
        // pipe.
        let stdin = child.stdin.take();
        let input = input.to_vec();
        std::thread::spawn(move || {
            if let Some(mut stdin) = stdin {
                // A program that exits without reading its input is not an error in itself.
                let _ = stdin.write_all(&input);
            }
        });
        let stdout = child.stdout.take().map(|stdout| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = stdout.take(MAX_ANSWER_BYTES + 1).read_to_end(&mut bytes);
                bytes
            })
        });
        let stderr = child.stderr.take().map(|stderr| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = stderr.take(64 * 1024).read_to_end(&mut bytes);
                bytes
            })
        });
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(1);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(HookError::new(format!(
                        "`{program}` gave no answer within {:?} and was stopped",
                        self.timeout
                    )));
                }
                Ok(None) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(error) => {
                    let _ = child.kill();
                    return Err(HookError::new(format!("waiting for `{program}`: {error}")));
                }
            }
        };
        let stdout = stdout
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default();
        if !status.success() {
            let stderr = stderr
                .and_then(|reader| reader.join().ok())
                .unwrap_or_default();
            return Err(HookError::new(format!(
                "`{program}` exited with {status}{}",
                stderr_excerpt(&stderr).map_or_else(
                    || " (it wrote nothing on standard error)".to_owned(),
                    |excerpt| format!(": {excerpt}")
                )
            )));
        }
        if stdout.len() as u64 > MAX_ANSWER_BYTES {
            return Err(HookError::new(format!(
                "`{program}` answered with more than {MAX_ANSWER_BYTES} bytes"
            )));
        }
        Ok(stdout)
    }
}

/// Runs `work`, which blocks, telling a multi-threaded runtime to move its other tasks off
/// this thread meanwhile.
fn off_the_runtime<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

fn quoted(keys: &[&str]) -> String {
    keys.iter()
        .map(|key| format!("`{key}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn to_payload(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The messages under `key` of an answer, in the OpenAI chat format.
fn messages_at(answer: &Map<String, Value>, key: &str) -> Result<Vec<Message>, HookError> {
    openai::parse_messages(&answer[key])
        .map_err(|error| HookError::new(format!("`{key}` of its answer: {error}")))
}

/// The text (or null, when `nullable`) under `key` of an answer.
fn text_at(
    answer: &Map<String, Value>,
    key: &str,
    nullable: bool,
) -> Result<Option<String>, HookError> {
    match &answer[key] {
        Value::String(text) => Ok(Some(text.clone())),
        Value::Null if nullable => Ok(None),
        other => Err(HookError::new(format!(
            "`{key}` of its answer is {}, not {}",
            contexture_core::format::json_type(other),
            if nullable {
                "a string or null"
            } else {
                "a string"
            }
        ))),
    }
}

impl Hook for ProgramHook {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_step_enter(
        &self,
        step: &StepInfo,
        task: Option<String>,
    ) -> Result<Option<String>, HookError> {
        let payload = to_payload(json!({"step": step, "task": task}));
        match self.ask(HookPoint::OnStepEnter, payload, &["task"])? {
            Some(answer) => text_at(&answer, "task", true),
            None => Ok(task),
        }
    }

    fn before_llm_call(
        &self,
        call: &CallInfo,
        messages: &[Message],
    ) -> Result<BeforeCall, HookError> {
        let payload = to_payload(json!({"call": call, "messages": openai::to_values(messages)}));
        let keys = ["view", "append", "replace"];
        let Some(answer) = self.ask(HookPoint::BeforeLlmCall, payload, &keys)? else {
            return Ok(BeforeCall::Continue);
        };
        if answer.len() > 1 {
            return Err(HookError::new(format!(
                "its answer to before_llm_call holds {}: give one of `view`, `append` or `replace`",
                quoted(&answer.keys().map(String::as_str).collect::<Vec<_>>())
            )));
        }
        let (key, _) = answer.iter().next().expect("one key");
        let messages = messages_at(&answer, key)?;
        Ok(match key.as_str() {
            "view" => BeforeCall::View(messages),
            "append" => BeforeCall::Record(HistoryChange::Append(messages)),
            _ => BeforeCall::Record(HistoryChange::Replace(messages)),
        })
    }

    fn after_llm_call(&self, call: &CallInfo, reply: Message) -> Result<Message, HookError> {
        let payload = to_payload(json!({"call": call, "reply": openai::to_value(&reply)}));
        match self.ask(HookPoint::AfterLlmCall, payload, &["reply"])? {
            Some(answer) => openai::parse_message(&answer["reply"])
                .map_err(|error| HookError::new(format!("`reply` of its answer: {error}"))),
            None => Ok(reply),
        }
    }

    fn on_step_exit(&self, step: &StepInfo, output: String) -> Result<String, HookError> {
        let payload = to_payload(json!({"step": step, "output": output}));
        match self.ask(HookPoint::OnStepExit, payload, &["output"])? {
            Some(answer) => Ok(text_at(&answer, "output", false)?.unwrap_or_default()),
            None => Ok(output),
        }
    }

    fn before_compaction(&self, compaction: &CompactionInfo) -> Result<bool, HookError> {
        let payload = to_payload(json!({"compaction": compaction}));
        match self.ask(HookPoint::BeforeCompaction, payload, &["skip"])? {
            Some(answer) => match &answer["skip"] {
                Value::Bool(skip) => Ok(!skip),
                other => Err(HookError::new(format!(
                    "`skip` of its answer is {}, not true or false",
                    contexture_core::format::json_type(other)
                ))),
            },
            None => Ok(true),
        }
    }

    fn after_compaction(
        &self,
        compaction: &CompactionInfo,
        report: &CompactionReport,
    ) -> Result<(), HookError> {
        let payload = to_payload(json!({"compaction": compaction, "report": report}));
        self.ask(HookPoint::AfterCompaction, payload, &[])?;
        Ok(())
    }
}
