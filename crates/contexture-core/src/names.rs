//! The names clients give things (thread ids, context names, op ids) are visible text: a
//! name may not hold a character that does not show, so two names that look the same are
//! one name. What does not show is decided by Unicode's properties, not by a list kept
//! here: control characters (`Cc`), every default-ignorable code point (zero-width
//! characters, bidi controls, variation selectors, the tag block, the soft hyphen, U+180E,
//! ...), and the line and paragraph separators (`Zl`, `Zp`).

use icu_properties::props::{DefaultIgnorableCodePoint, GeneralCategory};
use icu_properties::{CodePointMapData, CodePointSetData};

/// The first character of `name` that does not show, if any (see the module
/// documentation).
pub fn hidden_char(name: &str) -> Option<char> {
    let ignorable = CodePointSetData::new::<DefaultIgnorableCodePoint>();
    let category = CodePointMapData::<GeneralCategory>::new();
    name.chars().find(|&c| {
        ignorable.contains(c)
            || matches!(
                category.get(c),
                GeneralCategory::Control
                    | GeneralCategory::LineSeparator
                    | GeneralCategory::ParagraphSeparator
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_that_do_not_show_are_found_by_their_properties() {
        // (text, the hidden character found)
        let table = [
            ("plain-id_1.2", None),
            ("héllo wörld 你好 👋", None),
            ("emoji-with-selector-☺\u{FE0F}", Some('\u{FE0F}')),
            ("tag\u{E0041}block", Some('\u{E0041}')),
            ("line\u{2028}sep", Some('\u{2028}')),
            ("para\u{2029}sep", Some('\u{2029}')),
            ("mongolian\u{180E}vowel", Some('\u{180E}')),
            ("zero\u{200B}width", Some('\u{200B}')),
            ("bidi\u{202E}override", Some('\u{202E}')),
            ("soft\u{00AD}hyphen", Some('\u{00AD}')),
            ("bom\u{FEFF}", Some('\u{FEFF}')),
            ("hangul\u{3164}filler", Some('\u{3164}')),
            ("selector\u{E0100}supplement", Some('\u{E0100}')),
            ("tab\tcontrol", Some('\t')),
            ("nul\0", Some('\0')),
            ("del\u{7F}", Some('\u{7F}')),
            ("c1\u{85}next-line", Some('\u{85}')),
        ];
        for (text, hidden) in table {
            assert_eq!(hidden_char(text), hidden, "{text:?}");
        }
    }
}
