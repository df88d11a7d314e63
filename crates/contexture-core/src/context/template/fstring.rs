//! The simple template syntax: `{name}` (any path: `{user.name}`, `{files[0]}`,
//! `{data/items}`) is a variable, `{{` and `}}` are literal braces, and everything else is
//! text. It means exactly what the Jinja syntax means for the same variables (the same names,
//! the same missing-variable policy, the same sandbox): a simple template is turned into an
//! equivalent Jinja one and rendered as that, a missing variable kept as the `{name}` it was
//! written as.

use std::collections::BTreeSet;

use super::TemplateError;
use crate::context::path::Path;

/// One piece of a simple template.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Piece {
    /// Text, its `{{` and `}}` already turned into single braces.
    Text(String),
    /// A variable: the text between the braces, and the path it names.
    Field {
        /// As written between the braces.
        written: String,
        /// What it names.
        path: Path,
    },
}

/// The pieces of a simple template, or the first mistake with its line and column.
pub(crate) fn parse(source: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = source.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().is_some_and(|&(_, next)| next == '{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek().is_some_and(|&(_, next)| next == '}') => {
                chars.next();
                text.push('}');
            }
            '}' => {
                return Err(syntax(
                    source,
                    at,
                    "a single `}` outside a variable (write `}}` for a literal brace)",
                ));
            }
            '{' => {
                let start = at + 1;
                let end = loop {
                    match chars.next() {
                        Some((end, '}')) => break end,
                        Some((inner, '{')) => {
                            return Err(syntax(
                                source,
                                inner,
                                "`{` inside a variable (write `{{` for a literal brace)",
                            ));
                        }
                        Some(_) => {}
                        None => {
                            return Err(syntax(
                                source,
                                at,
                                "`{` starts a variable that is never closed with `}` (write `{{` for a literal brace)",
                            ));
                        }
                    }
                };
                let written = source[start..end].trim();
                if written.is_empty() {
                    return Err(syntax(
                        source,
                        at,
                        "an empty variable `{}` (write `{{}}` for literal braces)",
                    ));
                }
                if let Some(spec) = written.find([':', '!']) {
                    return Err(syntax(
                        source,
                        start + spec,
                        "format specs and conversions (`{x:>10}`, `{x!r}`) are not supported: use the jinja format for filters",
                    ));
                }
                let path = Path::parse(written).map_err(|error| {
                    syntax(
                        source,
                        start,
                        &format!("`{{{written}}}` is not a variable name: {}", error.reason),
                    )
                })?;
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Field {
                    written: written.to_owned(),
                    path,
                });
            }
            other => text.push(other),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// The root names a simple template reads, sorted.
pub(crate) fn variables(pieces: &[Piece]) -> BTreeSet<String> {
    pieces
        .iter()
        .filter_map(|piece| match piece {
            Piece::Field { path, .. } => Some(path.root.clone()),
            Piece::Text(_) => None,
        })
        .collect()
}

/// The same template in Jinja syntax, without a context: each variable a `{{ path }}` tag
/// (so a missing one is kept in that form). The template must parse.
pub(crate) fn to_jinja(source: &str) -> String {
    parse(source)
        .unwrap_or_default()
        .into_iter()
        .map(|piece| match piece {
            Piece::Text(text) => jinja_text(&text),
            Piece::Field { path, .. } => format!("{{{{ {} }}}}", path.to_jinja()),
        })
        .collect()
}

/// Jinja source that prints `text` as it is: every `{` is printed by an expression, so no
/// tag can start in it.
pub(crate) fn jinja_text(text: &str) -> String {
    text.replace('{', "{{ '{' }}")
}

fn syntax(source: &str, at: usize, message: &str) -> TemplateError {
    let before = &source[..at];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |line| line.chars().count())
        + 1;
    TemplateError::FstringSyntax {
        line,
        column,
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_and_mistakes() {
        let pieces = parse("Hi {name}, {{literal}} {user.roles[0]}!").unwrap();
        assert_eq!(pieces.len(), 5);
        assert_eq!(pieces[0], Piece::Text("Hi ".into()));
        assert_eq!(pieces[2], Piece::Text(", {literal} ".into()));
        assert_eq!(
            variables(&pieces).into_iter().collect::<Vec<_>>(),
            ["name", "user"]
        );
        let cases = [
            ("a } b", 1, 3, "a single `}`"),
            ("line\n  {open", 2, 3, "never closed"),
            ("{}", 1, 1, "an empty variable"),
            ("{x:>10}", 1, 3, "format specs"),
            ("{a {b}}", 1, 4, "`{` inside a variable"),
            ("{1abc}", 1, 2, "is not a variable name"),
        ];
        for (source, line, column, words) in cases {
            match parse(source) {
                Err(TemplateError::FstringSyntax {
                    line: l,
                    column: c,
                    message,
                }) => {
                    assert_eq!((l, c), (line, column), "{source}: {message}");
                    assert!(message.contains(words), "{source}: {message}");
                }
                other => panic!("{source}: {other:?}"),
            }
        }
    }
}
