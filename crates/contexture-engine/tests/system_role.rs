//! The system-role fallback over real HTTP: a provider that refuses the `system` role answers
//! a model declared `system_role: user` (its prompt sent as the first user message, never
//! twice, in every call of a tool loop) and refuses one left `native`; `both` sends it in
//! both places and counts it twice against the window; a models file and an assistant's
//! `context` both declare it, and an unknown value is named.

use crate::common;

use std::sync::Arc;

use common::{http_executor, sqlite, start};
use contexture_core::fit::{Rules, SystemRole, validate};
use contexture_core::format::openai;
use contexture_core::registry::Registry;
use contexture_engine::executor::Executor;
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::Store;
use serde_json::Value;

fn executor<S: Store>(store: S, base: &str, registry: Registry) -> Executor<S> {
    http_executor(store, base).with_registry(Arc::new(registry))
}

/// A provider that refuses any request holding a `system` message, and otherwise answers
/// the first call with a tool call and the next with text.
async fn refusing_system() -> FakeUpstream {
    let upstream = FakeUpstream::scripted([]).await;
    upstream.otherwise(|number, request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let has_system = body["messages"]
            .as_array()
            .is_some_and(|messages| messages.iter().any(|m| m["role"] == "system"));
        if has_system {
            Reply::error(400, "this model does not support the system role")
        } else if number == 1 {
            Reply::tool_call("c1", "t", serde_json::json!({}))
        } else {
            Reply::text("done")
        }
    });
    upstream
}

fn workflow(context: &str) -> String {
    format!(
        "assistants:\n  - id: a\n    model: gpt-4o-mini\n    system_prompt: Answer in French.\n    tools: [t]\n    context: {context}\ntools:\n  - {{id: t, response: result}}\nstates:\n  - {{id: s, assistant_id: a, task: Go, next: {{end: true}}}}\n"
    )
}

fn roles(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_model_that_ignores_the_system_role_gets_its_prompt_as_the_first_user_message() {
    let upstream = refusing_system().await;
    let (_dir, store) = sqlite().await;
    let exec = executor(store, &upstream.base_url(), Registry::builtin());
    let out = start(&exec, &workflow("{system_role: user}"), "")
        .await
        .expect("the provider answers every call");
    assert_eq!(out.output, "done");
    let bodies = upstream.bodies();
    assert_eq!(bodies.len(), 2);
    for body in &bodies {
        let messages = openai::parse_request(body).unwrap();
        // The prompt once, first, as a user turn; every request still follows the rules.
        assert_eq!(messages[0].text(), "Answer in French.");
        assert_eq!(
            messages
                .iter()
                .filter(|m| m.text().contains("Answer in French."))
                .count(),
            1
        );
        assert_eq!(validate(&messages, Rules::OpenAi), vec![]);
    }
    assert_eq!(roles(&bodies[1]), ["user", "user", "assistant", "tool"]);

    // Left native, the same provider refuses the first call.
    let (_dir, store) = sqlite().await;
    let upstream = refusing_system().await;
    let exec = executor(store, &upstream.base_url(), Registry::builtin());
    let error = start(&exec, &workflow("{}"), "")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("does not support the system role"),
        "{error}"
    );
}

#[tokio::test]
async fn a_models_file_declares_it_and_both_counts_the_prompt_twice() {
    let mut registry = Registry::builtin();
    registry
        .apply_toml(
            "[models.\"gpt-4o-mini\"]\nsystem_role = \"both\"\n",
            "models.toml",
        )
        .unwrap();
    assert_eq!(
        registry.resolve("gpt-4o-mini").system_role,
        SystemRole::Both
    );
    let upstream = FakeUpstream::scripted([Reply::text("oui")]).await;
    let (_dir, store) = sqlite().await;
    let exec = executor(store.clone(), &upstream.base_url(), registry.clone());
    start(
        &exec,
        "assistants: [{id: a, model: gpt-4o-mini, system_prompt: Answer in French.}]\nstates: [{id: s, assistant_id: a, task: Go}]",
        "",
    )
    .await
    .unwrap();
    // Under OpenAI's rules two user turns may follow each other: the copy stays its own.
    assert_eq!(roles(&upstream.bodies()[0]), ["system", "user", "user"]);
    let events = common::events(&store, "run-1").await;
    let record = &common::requests(&events)[0];
    let system = registry
        .resolve("gpt-4o-mini")
        .counter
        .count_message(&contexture_core::Message::system("Answer in French."));
    let fit = record.fit.as_ref().expect("a fit record");
    assert!(
        fit.tokens_after >= 2 * u64::from(system),
        "both copies counted: {fit:?}"
    );

    let error = Registry::builtin()
        .apply_toml(
            "[models.x]\ncontext_window = 1000\nmax_output_tokens = 100\nsystem_role = \"human\"\n",
            "models.toml",
        )
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("unknown system_role `human` (known: native, user, both)")
            && error.contains("models.toml"),
        "{error}"
    );
    let error = start(
        &exec,
        &workflow("{system_role: human}").replace("run-1", "run-2"),
        "",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("workflow.yaml:6:28: assistants[0].context.system_role: unknown variant `human`, expected one of `native`, `user`, `both`"),
        "{error}"
    );
}

/// Under rules that require alternation, the moved prompt and the first user turn become
/// one turn; every placement under every rule set validates, and the prompt is sent once
/// (twice under `both`).
#[test]
fn every_placement_follows_every_providers_rules() {
    use contexture_core::Message;
    use contexture_core::budget::BudgetPolicy;
    use contexture_core::fit::Strategy;
    use contexture_engine::fitting::{FitTarget, fit_request};
    let history = vec![
        Message::user("Hi"),
        Message::assistant("Hello"),
        Message::user("Translate: cat"),
    ];
    let system = Message::system("Answer in French.");
    for rules in Rules::ALL {
        for role in SystemRole::ALL {
            let model = contexture_core::registry::ModelInfo {
                system_role: role,
                ..Registry::builtin().resolve("gpt-4o-mini")
            };
            let policy = BudgetPolicy::default();
            let target = FitTarget {
                enabled: true,
                model: &model,
                policy: &policy,
                strategy: Strategy::Last,
                rules,
                tools: &[],
                clear: None,
                truncate: None,
                hysteresis: None,
                thinking: None,
                shape: None,
            };
            let fitted = fit_request(Some(&system), history.clone(), &[], &target).unwrap();
            assert_eq!(validate(&fitted.messages, rules), vec![], "{rules} {role}");
            let sent = fitted
                .messages
                .iter()
                .filter(|m| m.text().contains("Answer in French."))
                .count();
            assert_eq!(
                sent,
                if role == SystemRole::Both { 2 } else { 1 },
                "{rules} {role}"
            );
            let has_system = fitted.messages[0].role == contexture_core::Role::System;
            assert_eq!(has_system, role != SystemRole::User, "{rules} {role}");
            assert!(
                fitted
                    .messages
                    .iter()
                    .any(|m| m.text().contains("Translate: cat"))
            );
        }
    }
}
