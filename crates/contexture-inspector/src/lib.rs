//! Contexture's inspector: what every LLM call was sent, why, and what it cost, rendered as
//! HTML. The same views serve the `/ui` pages of `contexture serve` (as fragments its page
//! loads) and `contexture inspect --html` (as one self-contained file).
//!
//! Rendering is pure: views are built from reports the engine read ([`ExecutionView`]) and
//! rendered through templates compiled into the binary, with HTML auto-escaping on for
//! every value, so a message holding markup shows as text.

mod budget_bar;
mod execution;
mod home;
mod message_view;
mod thread;

use minijinja::{AutoEscape, Environment, Value};

pub use budget_bar::BudgetBar;
pub use execution::{CallView, ExecutionView, StepView, TreeRow};
pub use home::{HomeView, ListRow};
pub use message_view::MessageView;
pub use thread::{CONTEXT_MESSAGES_SHOWN, ContextView, EventRow, ForkRow, ThreadView};

/// The inspector's style sheet (served as a file by `/ui`, inlined into a saved page).
pub const STYLE: &str = include_str!("../templates/inspector.css");

/// Why a view could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum InspectorError {
    /// A template failed (a defect of the inspector, not of the data).
    #[error("rendering the inspector's `{template}` view failed: {source}")]
    Render {
        /// The template.
        template: &'static str,
        /// What failed.
        #[source]
        source: minijinja::Error,
    },
}

/// The inspector's templates, compiled once.
#[derive(Debug)]
pub struct Inspector {
    templates: Environment<'static>,
}

impl Default for Inspector {
    fn default() -> Self {
        Inspector::new()
    }
}

/// The templates, by name.
const TEMPLATES: &[(&str, &str)] = &[
    ("macros.html", include_str!("../templates/macros.html")),
    (
        "execution.html",
        include_str!("../templates/execution.html"),
    ),
    ("thread.html", include_str!("../templates/thread.html")),
    ("home.html", include_str!("../templates/home.html")),
    (
        "execution_page.html",
        include_str!("../templates/execution_page.html"),
    ),
];

impl Inspector {
    /// The inspector with its templates.
    pub fn new() -> Inspector {
        let mut templates = Environment::new();
        // Every value is escaped, whatever the template's name: message contents are text.
        templates.set_auto_escape_callback(|_| AutoEscape::Html);
        templates.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        for (name, source) in TEMPLATES {
            templates
                .add_template(name, source)
                .unwrap_or_else(|error| panic!("the inspector's template {name}: {error}"));
        }
        Inspector { templates }
    }

    fn render(&self, template: &'static str, context: Value) -> Result<String, InspectorError> {
        self.templates
            .get_template(template)
            .and_then(|view| view.render(context))
            .map_err(|source| InspectorError::Render { template, source })
    }

    /// An execution's view as a fragment of the `/ui` page.
    pub fn execution_fragment(&self, view: &ExecutionView) -> Result<String, InspectorError> {
        self.render(
            "execution.html",
            minijinja::context! { execution => Value::from(minijinja::value::Serde(view)) },
        )
    }

    /// The list of threads and executions as a fragment of the `/ui` page.
    pub fn home_fragment(&self, view: &HomeView) -> Result<String, InspectorError> {
        self.render(
            "home.html",
            minijinja::context! { home => Value::from(minijinja::value::Serde(view)) },
        )
    }

    /// A thread's view as a fragment of the `/ui` page.
    pub fn thread_fragment(&self, view: &ThreadView) -> Result<String, InspectorError> {
        self.render(
            "thread.html",
            minijinja::context! { thread => Value::from(minijinja::value::Serde(view)) },
        )
    }

    /// An execution's view as one self-contained HTML page: its style inlined, no script,
    /// and a policy that lets it load nothing.
    pub fn execution_page(&self, view: &ExecutionView) -> Result<String, InspectorError> {
        self.render(
            "execution_page.html",
            minijinja::context! {
                execution => Value::from(minijinja::value::Serde(view)),
                style => STYLE,
            },
        )
    }
}
