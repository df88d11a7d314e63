//! Prompt templates as values: the simple `{name}` syntax with escapable braces beside Jinja,
//! the variables a template needs, partials (static and dynamic), and `+`.

use contexture_core::context::{
    ContextStore, MissingPolicy, PromptTemplate, RenderOptions, TemplateError, TemplateFormat,
    render_fstring,
};
use serde_json::{Value, json};

fn store(value: Value) -> ContextStore {
    ContextStore::from_map(value.as_object().expect("an object").clone())
}

/// 2024-05-06 09:30:15 UTC.
const NOW: i64 = 1_714_987_815;

#[test]
fn the_simple_syntax_renders_like_jinja_and_escapes_braces() {
    let context = store(json!({
        "name": "Ada",
        "user": {"roles": ["admin", "dev"]},
        "files": [{"name": "a.rs"}],
        "greeting": "Hello {{ name }}",
        "count": 3,
    }));
    let options = RenderOptions::fixed(NOW);
    let cases = [
        ("Hi {name}!", "Hi Ada!"),
        ("{user.roles[1]} and {files/0/name}", "dev and a.rs"),
        (
            "JSON: {{\"name\": \"{name}\"}}",
            "JSON: {\"name\": \"Ada\"}",
        ),
        (
            "literal {{name}} and {{{name}}}",
            "literal {name} and {Ada}",
        ),
        (
            "Jinja stays text: {{% if x %}} {{{{ y }}}}",
            "Jinja stays text: {% if x %} {{ y }}",
        ),
        (
            "{greeting}, {count} files on {current_date}",
            "Hello Ada, 3 files on 2024-05-06",
        ),
        ("{ name }", "Ada"),
        (
            "kept: {missing} and {user.missing}",
            "kept: {missing} and {user.missing}",
        ),
    ];
    for (template, expected) in cases {
        let rendered = render_fstring(template, &context, &options).unwrap();
        assert_eq!(rendered.text, expected, "{template}");
    }
    let rendered = render_fstring("{missing} {name}", &context, &options).unwrap();
    assert_eq!(rendered.missing, ["missing"]);
    assert_eq!(rendered.used_keys, ["name"]);
    let empty = options.clone().with_missing(MissingPolicy::Empty);
    assert_eq!(
        render_fstring("[{missing}]", &context, &empty)
            .unwrap()
            .text,
        "[]"
    );
    let strict = options.with_missing(MissingPolicy::Error);
    assert_eq!(
        render_fstring("{b} {a} {name} {a}", &context, &strict).unwrap_err(),
        TemplateError::Missing {
            names: vec!["a".into(), "b".into()]
        }
    );
}

#[test]
fn mistakes_in_the_simple_syntax_say_where_and_how_to_write_it() {
    let messages: Vec<String> = ["a } b", "one\ntwo {open", "{}", "{n:>4}"]
        .iter()
        .map(|source| PromptTemplate::fstring(*source).unwrap_err().to_string())
        .collect();
    insta::assert_snapshot!(messages.join("\n"), @r"
    template syntax error at line 1, column 3: a single `}` outside a variable (write `}}` for a literal brace)
    template syntax error at line 2, column 5: `{` starts a variable that is never closed with `}` (write `{{` for a literal brace)
    template syntax error at line 1, column 1: an empty variable `{}` (write `{{}}` for literal braces)
    template syntax error at line 1, column 3: format specs and conversions (`{x:>10}`, `{x!r}`) are not supported: use the jinja format for filters
    ");
    let jinja = PromptTemplate::jinja("fine\n{% if %}").unwrap_err();
    assert!(
        matches!(jinja, TemplateError::Syntax { line: 2, .. }),
        "{jinja}"
    );
}

#[test]
fn input_variables_leave_out_partials_and_dynamic_variables() {
    let cases: [(PromptTemplate, &[&str]); 4] = [
        (
            PromptTemplate::fstring("{topic} for {user.name} on {current_date}").unwrap(),
            &["topic", "user"],
        ),
        (
            PromptTemplate::jinja("{% for f in files %}{{ f }}{% endfor %} {{ tone | upper }}")
                .unwrap(),
            &["files", "tone"],
        ),
        (
            PromptTemplate::fstring("{topic} in {style}")
                .unwrap()
                .partial("style", json!("haiku")),
            &["topic"],
        ),
        (PromptTemplate::fstring("{{not a variable}}").unwrap(), &[]),
    ];
    for (template, expected) in cases {
        assert_eq!(
            template.input_variables(),
            expected,
            "{}",
            template.source()
        );
    }
}

#[test]
fn partials_are_filled_in_below_the_context_and_may_be_dynamic() {
    let template = PromptTemplate::fstring("{topic} as a {style}, written {today}")
        .unwrap()
        .partial("style", json!("haiku"))
        .partial("today", json!("{{ current_weekday }} {{ current_date }}"));
    let options = RenderOptions::fixed(NOW);
    let rendered = template
        .render(&store(json!({"topic": "Rust"})), &options)
        .unwrap();
    assert_eq!(rendered.text, "Rust as a haiku, written Monday 2024-05-06");
    // A context key of the same name wins over the partial.
    let rendered = template
        .render(
            &store(json!({"topic": "Rust", "style": "sonnet"})),
            &options,
        )
        .unwrap();
    assert_eq!(rendered.text, "Rust as a sonnet, written Monday 2024-05-06");
}

#[test]
fn templates_join_with_plus_keeping_both_sides_partials() {
    let context = store(json!({"topic": "Rust", "name": "Ada"}));
    let options = RenderOptions::fixed(NOW);
    let system = PromptTemplate::fstring("You write {style}s. ")
        .unwrap()
        .partial("style", json!("haiku"));
    let task = PromptTemplate::fstring("Topic: {topic} {{in braces}}.")
        .unwrap()
        .partial("unused", json!(1));
    let joined = (system.clone() + task).unwrap();
    assert_eq!(joined.format(), TemplateFormat::Fstring);
    assert_eq!(joined.partials().len(), 2);
    assert_eq!(
        joined.render(&context, &options).unwrap().text,
        "You write haikus. Topic: Rust {in braces}."
    );
    // A simple template joined to a Jinja one becomes Jinja, meaning the same.
    let signed = PromptTemplate::jinja(" Signed {{ name | upper }}.").unwrap();
    let mixed = (system.clone() + signed).unwrap();
    assert_eq!(mixed.format(), TemplateFormat::Jinja);
    assert_eq!(
        mixed.render(&context, &options).unwrap().text,
        "You write haikus.  Signed ADA."
    );
    // One partial with two values is refused, never silently chosen.
    let other = PromptTemplate::fstring("{style}")
        .unwrap()
        .partial("style", json!("sonnet"));
    assert_eq!(
        (system + other).unwrap_err(),
        TemplateError::PartialConflict {
            name: "style".into()
        }
    );
}
