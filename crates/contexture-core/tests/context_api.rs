//! The context store's library API as the workflow engine uses it: flags and conditions read
//! from workflow files, validation at load time, typed tool arguments, iteration round trips.

use contexture_core::context::args::{resolve_arg_list, resolve_args};
use contexture_core::context::iter::{merge_results, plan_items};
use contexture_core::context::{
    Branch, ClearContextStore, Condition, ContextStore, ExprError, MergePolicy, MissingPolicy,
    RenderOptions, Scope, Switch, TemplateError, TransitionFlags, apply_transition, parse_output,
    render, select_items,
};
use serde_json::{Value, json};

fn store(value: Value) -> ContextStore {
    ContextStore::from_map(value.as_object().expect("object").clone())
}

#[test]
fn flags_deserialize_with_page_defaults_and_reject_unknown_values() {
    let flags: TransitionFlags = serde_json::from_str("{}").unwrap();
    assert_eq!(flags, TransitionFlags::default());
    assert!(flags.store_in_context && flags.include_in_llm_history);
    assert!(!flags.clear_prior_messages && !flags.append_to_context);

    for (text, expected) in [
        ("false", ClearContextStore::No),
        ("true", ClearContextStore::All),
        ("\"keep_current\"", ClearContextStore::KeepCurrent),
    ] {
        let flags: TransitionFlags =
            serde_json::from_str(&format!("{{\"clear_context_store\": {text}}}")).unwrap();
        assert_eq!(flags.clear_context_store, expected, "{text}");
        // And back.
        let back = serde_json::to_value(&flags).unwrap();
        assert_eq!(back["clear_context_store"].to_string(), text);
    }
    let error = serde_json::from_str::<TransitionFlags>(r#"{"clear_context_store": "yes"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("must be false, true or \"keep_current\""),
        "{error}"
    );
    let error = serde_json::from_str::<TransitionFlags>(r#"{"store_in_contxt": false}"#)
        .unwrap_err()
        .to_string();
    assert!(error.contains("unknown field"), "{error}");
}

#[test]
fn malformed_conditions_fail_when_the_workflow_is_loaded() {
    let ok: Branch<String> = serde_json::from_value(
        json!({"expression": "user_role == 'admin'", "then": "admin-path", "otherwise": "user-path"}),
    )
    .unwrap();
    let ctx = store(json!({"user_role": "admin"}));
    assert_eq!(ok.choose(Scope::new(&ctx)).unwrap(), "admin-path");

    let error = serde_json::from_value::<Branch<String>>(
        json!({"expression": "user_role ==", "then": "a", "otherwise": "b"}),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("invalid expression \"user_role ==\" at column"),
        "{error}"
    );

    assert!(matches!(
        Condition::compile("   "),
        Err(ExprError::Syntax { column: 1, .. })
    ));
}

#[test]
fn switch_takes_the_first_true_case_else_the_default() {
    let switch: Switch<String> = serde_json::from_value(json!({
        "cases": [
            {"condition": "count > 10", "target": "many"},
            {"condition": "count > 3 and status in ['ok', 'done']", "target": "some"},
            {"condition": "count > 0", "target": "few"}
        ],
        "default": "none"
    }))
    .unwrap();
    let pick = |ctx: Value| {
        let ctx = store(ctx);
        switch.choose(Scope::new(&ctx)).unwrap().cloned()
    };
    assert_eq!(pick(json!({"count": 20})).as_deref(), Some("many"));
    assert_eq!(
        pick(json!({"count": 5, "status": "ok"})).as_deref(),
        Some("some")
    );
    assert_eq!(
        pick(json!({"count": 5, "status": "failed"})).as_deref(),
        Some("few")
    );
    assert_eq!(pick(json!({})).as_deref(), Some("none"));
}

#[test]
fn the_output_is_visible_to_conditions() {
    let ctx = store(json!({"output": "a context key", "threshold": 0.5}));
    let parsed = parse_output("{'score': 0.9}");
    let scope = Scope::new(&ctx).with_output(&parsed.value);
    let condition = Condition::compile("output.score > threshold").unwrap();
    assert!(condition.is_true(scope).unwrap());
}

#[test]
fn tool_arguments_come_only_from_the_configuration() {
    let ctx = store(json!({
        "endpoint": "https://evil.example.com",
        "user_id": "12345",
        "ids": [1, 2, 3],
        "injected": "never an argument"
    }));
    let configured = json!({
        "endpoint": "https://configured.example.com",
        "user": "{{user_id}}",
        "ids": "{{ ids }}",
        "nested": {"path": ["{{user_id}}/data", 7]}
    });
    let resolved = resolve_args(
        configured.as_object().unwrap(),
        &ctx,
        &RenderOptions::fixed(0),
    )
    .unwrap();
    assert_eq!(
        Value::Object(resolved.args),
        json!({
            "endpoint": "https://configured.example.com",
            "user": "12345",
            "ids": [1, 2, 3],
            "nested": {"path": ["12345/data", 7]}
        })
    );
    assert_eq!(resolved.used_keys, ["ids", "user_id"]);

    let list = resolve_arg_list(
        &[json!("{{user_id}}"), json!("--flag")],
        &ctx,
        &RenderOptions::fixed(0),
    )
    .unwrap();
    assert_eq!(list, [json!("12345"), json!("--flag")]);
}

#[test]
fn iteration_round_trip_with_flags_inside_each_item() {
    let parent = store(json!({"files": [{"name": "a"}, {"name": "b"}], "noise": 1}));
    let items = select_items("files", &parent, None).unwrap();
    let planned = plan_items(items, &parent, Some(&["files".to_owned()]));
    assert!(!planned[0].store.contains_key("noise"));
    assert_eq!(planned[1].store.get("name"), Some(&json!("b")));
    // Each item's step stores its output under the default flags.
    let results: Vec<ContextStore> = planned
        .iter()
        .map(|item| {
            let name = item.value["name"].as_str().unwrap();
            let output = parse_output(&format!(
                "{{\"result_{name}\": \"done\", \"last\": \"{name}\"}}"
            ));
            apply_transition(&TransitionFlags::default(), &item.store, &output).store
        })
        .collect();
    let merged = merge_results(&parent, &planned, &results, MergePolicy::LastWins).unwrap();
    assert_eq!(merged.get("result_a"), Some(&json!("done")));
    assert_eq!(merged.get("result_b"), Some(&json!("done")));
    assert_eq!(merged.get("last"), Some(&json!("b")));
    // The item's own keys (`name`) were part of its starting copy, not written by it: they do
    // not leak into the parent.
    assert_eq!(merged.get("name"), None);
    assert_eq!(merged.get("noise"), Some(&json!(1)));
    let error = merge_results(&parent, &planned, &results, MergePolicy::Error).unwrap_err();
    assert!(error.to_string().contains("both wrote key"), "{error}");
}

#[test]
fn template_locals_and_globals_are_not_missing_context_keys() {
    let ctx = store(json!({"items": ["x", "y"], "user": "{{ name }}", "name": "Ann"}));
    let render = |t: &str| render(t, &ctx, &RenderOptions::fixed(0)).unwrap().text;
    assert_eq!(
        render("{% for i in items %}{{ loop.index }}={{ i }} {% endfor %}"),
        "1=x 2=y "
    );
    assert_eq!(
        render("{{ 'literal' }} {{ 1 + 2 }} {{ none }}"),
        "literal 3 null"
    );
    assert_eq!(render("{% set n = namespace(v=1) %}{{ n.v }}"), "1");
    // A recursive value is rendered before its attributes are looked at.
    assert_eq!(render("{{ user }}"), "Ann");
    assert_eq!(render("{{ user.missing }}"), "{{ user.missing }}");
}

#[test]
fn the_user_context_is_read_before_context_keys_and_caller_variables() {
    let user_context = json!({"user": {"name": "Ada", "roles": ["admin", "dev"]}, "plan": "pro"});
    let options = RenderOptions::fixed(0)
        .with_variable("user_context", json!({"plan": "from a caller variable"}))
        .with_user_context(user_context.as_object().cloned());
    // A step wrote a key of the same name: it does not shadow the run's user context.
    let ctx = store(
        json!({"user_context": {"plan": "free"}, "greeting": "Hi {{ user_context.user.name }}"}),
    );
    let cases = [
        ("{{ user_context.plan }}", "pro"),
        ("{{ user_context.user.name }}", "Ada"),
        ("{{ user_context.user.roles[1] }}", "dev"),
        ("{{ user_context.user.roles | join(',') }}", "admin,dev"),
        (
            "{% if user_context.plan == 'pro' %}priority{% endif %}",
            "priority",
        ),
        // A context value's template reads it too.
        ("{{ greeting }}", "Hi Ada"),
        // A path below it that does not resolve follows the missing-variable policy.
        ("{{ user_context.locale }}", "{{ user_context.locale }}"),
    ];
    for (template, expected) in cases {
        assert_eq!(
            render(template, &ctx, &options).unwrap().text,
            expected,
            "{template}"
        );
    }
    let strict = options.clone().with_missing(MissingPolicy::Error);
    let error = render(
        "{{ user_context.locale }} {{ user_context.plan }}",
        &ctx,
        &strict,
    )
    .unwrap_err();
    assert_eq!(
        error,
        TemplateError::Missing {
            names: vec!["user_context.locale".into()]
        }
    );
    // Without one, `user_context` is an ordinary name: the context key answers.
    let plain = RenderOptions::fixed(0);
    assert_eq!(
        render("{{ user_context.plan }}", &ctx, &plain)
            .unwrap()
            .text,
        "free"
    );
}

#[test]
fn an_isolated_render_carries_the_user_context() {
    use contexture_core::context::isolation::RenderSettings;
    let options =
        RenderOptions::fixed(0).with_user_context(json!({"plan": "pro"}).as_object().cloned());
    let settings = RenderSettings::of(&options);
    let wire = serde_json::to_string(&settings).unwrap();
    let back: RenderSettings = serde_json::from_str(&wire).unwrap();
    let options = back.into_options(std::sync::Arc::new(
        contexture_core::context::FixedIds::default(),
    ));
    let text = render("{{ user_context.plan }}", &ContextStore::new(), &options)
        .unwrap()
        .text;
    assert_eq!(text, "pro");
    // Without a user context the wire form has no such field (older workers read it).
    let plain = serde_json::to_value(RenderSettings::of(&RenderOptions::fixed(0))).unwrap();
    assert!(plain.get("user_context").is_none());
}
