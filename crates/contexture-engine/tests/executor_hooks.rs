//! Hooks: order, chaining, exactly one firing per step and per call, views
//! for one call, recorded changes.

use crate::common;

use std::sync::{Arc, Mutex};

use common::{events, executor, script, sqlite, start, texts};
use contexture_core::Message;
use contexture_core::registry::Registry;
use contexture_core::thread::EventKind;
use contexture_engine::hooks::{BeforeCall, CallInfo, HistoryChange, Hook, HookError, StepInfo};
use contexture_store::Store;

/// What a probe's `before_llm_call` decides.
type Decide = Box<dyn Fn(&CallInfo, &[Message]) -> BeforeCall + Send + Sync>;

/// Records every firing as `name:point:step[:round]`, and changes what it is told to.
struct Probe {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    tag_task: bool,
    wrap_output: bool,
    before: Decide,
}

impl Probe {
    fn new(name: &'static str, log: Arc<Mutex<Vec<String>>>) -> Probe {
        Probe {
            name,
            log,
            tag_task: false,
            wrap_output: false,
            before: Box::new(|_, _| BeforeCall::Continue),
        }
    }

    fn note(&self, entry: String) {
        self.log.lock().unwrap().push(entry);
    }
}

impl Hook for Probe {
    fn name(&self) -> &str {
        self.name
    }

    fn on_step_enter(
        &self,
        step: &StepInfo,
        task: Option<String>,
    ) -> Result<Option<String>, HookError> {
        self.note(format!("{}:enter:{}", self.name, step.step));
        Ok(match task {
            Some(task) if self.tag_task => Some(format!("{task} +{}", self.name)),
            other => other,
        })
    }

    fn before_llm_call(
        &self,
        call: &CallInfo,
        messages: &[Message],
    ) -> Result<BeforeCall, HookError> {
        self.note(format!(
            "{}:before:{}:{}:{}",
            self.name,
            call.step.step,
            call.round,
            messages.len()
        ));
        Ok((self.before)(call, messages))
    }

    fn after_llm_call(&self, call: &CallInfo, mut reply: Message) -> Result<Message, HookError> {
        self.note(format!(
            "{}:after:{}:{}:{}",
            self.name,
            call.step.step,
            call.round,
            reply.text()
        ));
        if reply.tool_calls.is_empty() {
            let text = format!("{}>{}", reply.text(), self.name);
            reply.set_text(text);
        }
        Ok(reply)
    }

    fn on_step_exit(&self, step: &StepInfo, output: String) -> Result<String, HookError> {
        self.note(format!("{}:exit:{}", self.name, step.step));
        Ok(if self.wrap_output {
            format!("[{output}]")
        } else {
            output
        })
    }
}

const WORKFLOW: &str = r#"
assistants:
  - {id: a, model: gpt-4o-mini, tools: [t]}
tools:
  - {id: t, response: result}
states:
  - {id: one, assistant_id: a, task: One, next: {state_id: two}}
  - {id: two, assistant_id: a, task: Two, next: {state_id: three}}
  - {id: three, tool_id: t, next: {end: true, output_key: last}}
"#;

const REPLIES: &str = r#"
- tool_calls: [{id: c1, name: t}]
- content: first
- content: second
"#;

#[tokio::test]
async fn hooks_fire_once_per_step_and_per_call_in_order_and_chain() {
    let (_dir, store) = sqlite().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut first = Probe::new("h1", log.clone());
    first.tag_task = true;
    first.wrap_output = true;
    let mut second = Probe::new("h2", log.clone());
    second.tag_task = true;
    let provider = script(REPLIES);
    let exec = executor(store.clone(), provider.clone())
        .with_hook(Arc::new(first))
        .with_hook(Arc::new(second));
    let out = start(&exec, WORKFLOW, "").await.unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "h1:enter:1",
            "h2:enter:1",
            "h1:before:1:0:1",
            "h2:before:1:0:1",
            "h1:after:1:0:",
            "h2:after:1:0:",
            "h1:before:1:1:3",
            "h2:before:1:1:3",
            "h1:after:1:1:first",
            "h2:after:1:1:first>h1",
            "h1:exit:1",
            "h2:exit:1",
            "h1:enter:2",
            "h2:enter:2",
            "h1:before:2:0:3",
            "h2:before:2:0:3",
            "h1:after:2:0:second",
            "h2:after:2:0:second>h1",
            "h1:exit:2",
            "h2:exit:2",
            "h1:enter:3",
            "h2:enter:3",
            "h1:exit:3",
            "h2:exit:3",
        ]
    );
    // Each hook received the previous one's result.
    let sent = provider.requests();
    assert_eq!(sent[0].messages[0].text(), "One +h1 +h2");
    assert_eq!(
        texts(&sent[2].messages),
        ["One +h1 +h2", "[first>h1>h2]", "Two +h1 +h2"]
    );
    assert_eq!(out.store.get("last"), Some(&serde_json::json!("[result]")));
}

#[tokio::test]
async fn a_view_changes_one_call_and_leaves_the_thread_alone() {
    let (_dir, store) = sqlite().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut viewer = Probe::new("viewer", log.clone());
    viewer.before = Box::new(|call, messages| {
        if call.step.step == 1 {
            let mut view = messages.to_vec();
            view.insert(0, Message::system("Answer in French."));
            BeforeCall::View(view)
        } else {
            BeforeCall::Continue
        }
    });
    let counter = Probe::new("counter", log.clone());
    let provider = script("[{content: un}, {content: deux}]");
    let exec = executor(store.clone(), provider.clone())
        .with_hook(Arc::new(viewer))
        .with_hook(Arc::new(counter));
    start(
        &exec,
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: one, assistant_id: a, task: One, next: {state_id: two}}\n  - {id: two, assistant_id: a, task: Two}",
        "",
    )
    .await
    .unwrap();
    let sent = provider.requests();
    assert_eq!(texts(&sent[0].messages), ["Answer in French.", "One"]);
    assert_eq!(
        texts(&sent[1].messages),
        ["One", "un>viewer>counter", "Two"]
    );
    // The next hook saw the view (2 messages), and the recorded request is the view.
    assert!(
        log.lock()
            .unwrap()
            .contains(&"counter:before:1:0:2".to_owned())
    );
    let recorded = common::requests(&events(&store, "run-1").await);
    assert_eq!(recorded[0].messages, sent[0].messages);
    let thread = store.load("run-1").await.unwrap();
    assert!(!texts(&thread.projection().messages).contains(&"Answer in French.".to_owned()));
}

#[tokio::test]
async fn a_recorded_change_is_in_the_thread_and_the_rebuilt_request() {
    let (_dir, store) = sqlite().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut recorder = Probe::new("recorder", log.clone());
    recorder.before = Box::new(|call, _| {
        if call.step.step == 1 {
            BeforeCall::Record(HistoryChange::Append(vec![
                Message::user("Remember: the code is 1234.").pinned(),
            ]))
        } else {
            BeforeCall::Continue
        }
    });
    let counter = Probe::new("counter", log.clone());
    let provider = script("[{content: un}, {content: deux}]");
    let exec = executor(store.clone(), provider.clone())
        .with_hook(Arc::new(recorder))
        .with_hook(Arc::new(counter));
    start(
        &exec,
        "assistants: [{id: a, model: gpt-4o-mini}]\nstates:\n  - {id: one, assistant_id: a, task: One, next: {state_id: two}}\n  - {id: two, assistant_id: a, task: Two}",
        "hi",
    )
    .await
    .unwrap();
    let sent = provider.requests();
    assert_eq!(
        texts(&sent[0].messages),
        ["hi", "Remember: the code is 1234.", "One"]
    );
    assert_eq!(
        texts(&sent[1].messages),
        [
            "hi",
            "Remember: the code is 1234.",
            "One",
            "un>recorder>counter",
            "Two"
        ]
    );
    let entries = log.lock().unwrap().clone();
    // Each hook fired once per call, the rebuild notwithstanding; the next hook saw it.
    assert_eq!(
        entries
            .iter()
            .filter(|e| e.starts_with("counter:before:1"))
            .collect::<Vec<_>>(),
        ["counter:before:1:0:3"]
    );
    assert_eq!(
        entries
            .iter()
            .filter(|e| e.starts_with("recorder:before"))
            .count(),
        2
    );
    let appended = events(&store, "run-1")
        .await
        .iter()
        .filter(
            |e| matches!(&e.kind, EventKind::MessageAppended { message } if message.is_pinned()),
        )
        .count();
    assert_eq!(appended, 1);
}

#[tokio::test]
async fn a_view_over_the_budget_fails_the_step_naming_the_hook() {
    let (_dir, store) = sqlite().await;
    let mut registry = Registry::builtin();
    registry
        .apply_toml(
            "[models.tiny]\ncontext_window = 400\nmax_output_tokens = 100\nencoding = \"o200k_base\"\n",
            "tiny.toml",
        )
        .unwrap();
    let mut bloater = Probe::new("bloater", Arc::new(Mutex::new(Vec::new())));
    bloater.before = Box::new(|_, messages| {
        let mut view = messages.to_vec();
        view.push(Message::user("word ".repeat(2000)));
        BeforeCall::View(view)
    });
    let exec = executor(store, script("[{content: x}]"))
        .with_registry(Arc::new(registry))
        .with_hook(Arc::new(bloater));
    let error = start(
        &exec,
        "assistants: [{id: a, model: tiny}]\nstates: [{id: s, assistant_id: a, task: T}]",
        "",
    )
    .await
    .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("hook `bloater` gave messages of")
            && text.contains("over the request's limit of 300"),
        "{text}"
    );
}
