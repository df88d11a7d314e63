//! Finding template syntax in text: the `{{ ... }}` expression tags of a template source
//! (skipping comments, statements and `{% raw %}` blocks), the lone tag a typed render
//! looks for, and whether a string or a JSON value holds a template at all.

use serde_json::Value;

use crate::context::path::Path;

/// An expression tag `{{ ... }}` found by [`scan_tags`]: byte range of the whole tag and of
/// its expression (without whitespace-control markers).
#[derive(Debug, Clone, Copy)]
pub(super) struct Tag {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) inner_start: usize,
    pub(super) inner_end: usize,
}

impl Tag {
    /// The tag's expression.
    pub(super) fn inner<'s>(&self, source: &'s str) -> &'s str {
        &source[self.inner_start..self.inner_end]
    }

    /// The tag with its expression replaced, keeping its delimiters and markers.
    pub(super) fn with_inner(&self, source: &str, inner: &str) -> String {
        format!(
            "{} {inner} {}",
            &source[self.start..self.inner_start],
            &source[self.inner_end..self.end]
        )
    }
}

/// Finds the `{{ ... }}` tags of a template, skipping comments, statements and
/// `{% raw %}` blocks, and respecting string literals inside tags. Linear in the source.
pub(super) fn scan_tags(source: &str) -> Vec<Tag> {
    let bytes = source.as_bytes();
    let mut tags = Vec::new();
    let mut i = 0;
    while let Some(found) = source[i..].find('{') {
        let at = i + found;
        match bytes.get(at + 1) {
            Some(b'{') => {
                let mut inner_start = at + 2;
                if matches!(bytes.get(inner_start), Some(b'-' | b'+')) {
                    inner_start += 1;
                }
                let Some(close) = find_close(bytes, inner_start, b'}') else {
                    break;
                };
                let mut inner_end = close;
                if inner_end > inner_start && matches!(bytes[inner_end - 1], b'-' | b'+') {
                    inner_end -= 1;
                }
                tags.push(Tag {
                    start: at,
                    end: close + 2,
                    inner_start,
                    inner_end,
                });
                i = close + 2;
            }
            Some(b'%') => {
                let Some(close) = find_close(bytes, at + 2, b'%') else {
                    break;
                };
                let body = source[at + 2..close].trim_matches(|c: char| c == '-' || c == '+');
                i = close + 2;
                if body.trim() == "raw" {
                    match find_endraw(source, i) {
                        Some(end) => i = end,
                        None => break,
                    }
                }
            }
            Some(b'#') => match source[at + 2..].find("#}") {
                Some(end) => i = at + 2 + end + 2,
                None => break,
            },
            _ => i = at + 1,
        }
    }
    tags
}

/// The index of the `<delim>}` closing a tag whose body starts at `from`, skipping string
/// literals.
fn find_close(bytes: &[u8], from: usize, delim: u8) -> Option<usize> {
    let mut i = from;
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                if b == b'\\' {
                    i += 1;
                } else if b == q {
                    quote = None;
                }
            }
            None => {
                if b == b'\'' || b == b'"' {
                    quote = Some(b);
                } else if b == delim && bytes.get(i + 1) == Some(&b'}') {
                    return Some(i);
                }
            }
        }
        i += 1;
    }
    None
}

/// The end of the `{% endraw %}` tag after `from`.
fn find_endraw(source: &str, from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(found) = source[i..].find("{%") {
        let at = i + found;
        let close = source[at + 2..].find("%}")? + at + 2;
        let body = source[at + 2..close].trim_matches(|c: char| c == '-' || c == '+');
        if body.trim() == "endraw" {
            return Some(close + 2);
        }
        i = at + 2;
    }
    None
}

/// The expression of a template that is exactly one expression tag.
pub(super) fn single_expression_tag(template: &str) -> Option<&str> {
    let trimmed = template.trim();
    let tags = scan_tags(trimmed);
    match tags.as_slice() {
        [tag] if tag.start == 0 && tag.end == trimmed.len() => Some(tag.inner(trimmed).trim()),
        _ => None,
    }
}

/// The path of a template that is exactly one plain-path expression tag.
pub(super) fn single_path_tag(template: &str) -> Option<Path> {
    let trimmed = template.trim();
    let tags = scan_tags(trimmed);
    match tags.as_slice() {
        [tag] if tag.start == 0 && tag.end == trimmed.len() => Path::parse(tag.inner(trimmed)).ok(),
        _ => None,
    }
}

/// True if `text` contains template syntax.
pub fn has_template(text: &str) -> bool {
    text.contains("{{") || text.contains("{%")
}

/// True if `value` holds a string with template syntax, at any depth.
pub(super) fn value_has_template(value: &Value) -> bool {
    match value {
        Value::String(s) => has_template(s),
        Value::Array(items) => items.iter().any(value_has_template),
        Value::Object(map) => map.values().any(value_has_template),
        _ => false,
    }
}
