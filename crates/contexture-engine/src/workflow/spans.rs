//! Where each node of a YAML document is: a map from a node's path (`states[1].next.state_id`)
//! to its line and column, so that validation errors found after deserializing still point
//! into the file.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser};

/// A position in a source file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

/// The positions of a document's nodes, by path.
#[derive(Debug, Default)]
pub(crate) struct SpanIndex {
    positions: HashMap<String, Position>,
}

enum Frame {
    Mapping { path: String, key: Option<String> },
    Sequence { path: String, next_index: usize },
}

impl SpanIndex {
    /// Indexes `text`. A document the parser rejects yields an empty index: the serde pass
    /// reports that error with its own position.
    pub fn build(text: &str) -> SpanIndex {
        let mut index = SpanIndex::default();
        let mut stack: Vec<Frame> = Vec::new();
        for event in Parser::new_from_str(text) {
            let Ok((event, span)) = event else {
                break;
            };
            let position = Position {
                line: span.start.line(),
                column: span.start.col() + 1,
            };
            match event {
                Event::Scalar(value, ..) => {
                    // A scalar is a mapping key when the enclosing mapping awaits one.
                    if let Some(Frame::Mapping { path, key }) = stack.last_mut()
                        && key.is_none()
                    {
                        let child = join(path, &value);
                        index.positions.entry(child).or_insert(position);
                        *key = Some(value.into_owned());
                        continue;
                    }
                    // A scalar value points at itself rather than at its key.
                    if let Some(path) = Self::child_path(&mut stack) {
                        index.positions.insert(path, position);
                    }
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let path = Self::child_path(&mut stack).unwrap_or_default();
                    index.positions.entry(path.clone()).or_insert(position);
                    stack.push(if matches!(event, Event::MappingStart(..)) {
                        Frame::Mapping { path, key: None }
                    } else {
                        Frame::Sequence {
                            path,
                            next_index: 0,
                        }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                Event::Alias(_) => {
                    Self::child_path(&mut stack);
                }
                _ => {}
            }
        }
        index
    }

    /// The path of the value node that comes next in the innermost container, consuming the
    /// pending key or sequence slot.
    fn child_path(stack: &mut [Frame]) -> Option<String> {
        match stack.last_mut()? {
            Frame::Mapping { path, key } => key.take().map(|key| join(path, &key)),
            Frame::Sequence { path, next_index } => {
                let child = format!("{path}[{next_index}]");
                *next_index += 1;
                Some(child)
            }
        }
    }

    /// The position of the node at `path`, or of its nearest indexed ancestor.
    pub fn locate(&self, path: &str) -> Position {
        let mut current = path;
        loop {
            if let Some(position) = self.positions.get(current) {
                return *position;
            }
            match current.rfind(['.', '[']) {
                Some(cut) => current = &current[..cut],
                None => {
                    return self
                        .positions
                        .get("")
                        .copied()
                        .unwrap_or(Position { line: 1, column: 1 });
                }
            }
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_positions() {
        let text = "states:\n  - id: a\n    next:\n      state_id: b\n  - id: b\n";
        let index = SpanIndex::build(text);
        assert_eq!(index.locate("states"), Position { line: 1, column: 1 });
        assert_eq!(
            index.locate("states[0].id"),
            Position { line: 2, column: 9 }
        );
        assert_eq!(
            index.locate("states[0].next.state_id"),
            Position {
                line: 4,
                column: 17
            }
        );
        assert_eq!(
            index.locate("states[1].id"),
            Position { line: 5, column: 9 }
        );
        // Unknown paths fall back to the nearest ancestor.
        assert_eq!(
            index.locate("states[1].next.state_id"),
            Position { line: 5, column: 5 }
        );
    }

    #[test]
    fn flow_style_is_indexed_too() {
        let index = SpanIndex::build("tools: [{id: x}, {id: y}]\n");
        assert_eq!(
            index.locate("tools[1].id"),
            Position {
                line: 1,
                column: 23
            }
        );
    }
}
