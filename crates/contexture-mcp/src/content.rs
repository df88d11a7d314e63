//! A tool result's content as the text a model reads.

use rmcp::model::CallToolResult;
use serde_json::Value;

/// The text of `result`: text parts as they are, one per line; an image or audio part as
/// its type and size (a model reading text cannot use the bytes); an embedded resource as
/// its text, else its URI; a resource link as its URI. Without content, the structured
/// content as JSON.
pub(crate) fn result_text(result: &CallToolResult) -> String {
    let parts: Vec<String> = result
        .content
        .iter()
        .map(|block| match block.as_text() {
            Some(text) => text.text.clone(),
            None => serde_json::to_value(block)
                .map(|value| describe(&value))
                .unwrap_or_else(|_| "[content that could not be read]".to_owned()),
        })
        .collect();
    if parts.is_empty() {
        return match &result.structured_content {
            Some(structured) => structured.to_string(),
            None => String::new(),
        };
    }
    parts.join("\n")
}

/// A part that is not text, in brackets.
fn describe(part: &Value) -> String {
    let field = |name: &str| part.get(name).and_then(Value::as_str).unwrap_or("");
    match field("type") {
        kind @ ("image" | "audio") => format!(
            "[{kind}: {}, {} characters of base64 not shown]",
            field("mimeType"),
            field("data").len()
        ),
        "resource" => {
            let resource = part.get("resource").unwrap_or(&Value::Null);
            match resource.get("text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => format!(
                    "[resource: {}]",
                    resource.get("uri").and_then(Value::as_str).unwrap_or("")
                ),
            }
        }
        "resource_link" => format!("[resource link: {}]", field("uri")),
        other => format!("[{other} content]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(json: Value) -> CallToolResult {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn every_kind_of_part_reads_as_text() {
        let text = result_text(&result(serde_json::json!({"content": [
            {"type": "text", "text": "first"},
            {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}},
            {"type": "resource", "resource": {"uri": "file:///b", "blob": "AAAA"}},
            {"type": "resource_link", "uri": "file:///c", "name": "c"}
        ]})));
        assert_eq!(
            text,
            "first\n[image: image/png, 8 characters of base64 not shown]\ninside\n[resource: file:///b]\n[resource link: file:///c]"
        );
        let structured = result_text(&result(
            serde_json::json!({"content": [], "structuredContent": {"n": 1}}),
        ));
        assert_eq!(structured, r#"{"n":1}"#);
    }
}
