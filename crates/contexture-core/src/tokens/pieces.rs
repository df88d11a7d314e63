//! Pre-tokenizing: cutting a text into the pieces that byte-pair encoding then counts, as
//! the encodings' published patterns do.
//!
//! The patterns are regular expressions over Unicode classes (letters, numbers, white
//! space), and running the regex is most of the time a count takes. For ASCII the classes
//! are a byte test each, so a piece whose every examined byte is ASCII is cut here by hand
//! from the same rules. Where deciding a piece needs a byte that is not ASCII (a letter
//! run that goes on into `é`, a space run that ends at a no-break space, `'ſ` which the
//! case-insensitive contraction matches), that one piece is cut by the regex itself.
//!
//! Cutting a piece depends only on the text from where it starts (the patterns have no
//! look-behind, and their `$` is the end of the text), so both ways of cutting can take
//! turns within one text and give exactly the regex's pieces; a property test holds them
//! to it.

use std::sync::LazyLock;

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};

/// What the patterns tell apart among ASCII bytes (`\s` is Unicode's `White_Space`, which
/// leaves out the ASCII separators 0x1C-0x1F).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Upper,
    Lower,
    Digit,
    /// `\r` or `\n`.
    Newline,
    /// White space other than `\r` and `\n`.
    Space,
    /// Neither white space, a letter nor a digit.
    Other,
    /// Past the text's last byte.
    End,
}

impl Class {
    fn is_letter(self) -> bool {
        matches!(self, Class::Upper | Class::Lower)
    }

    fn is_space(self) -> bool {
        matches!(self, Class::Space | Class::Newline)
    }

    /// `[^\r\n\p{L}\p{N}]`: what may stand before a letter run in the same piece.
    fn is_letter_prefix(self) -> bool {
        matches!(self, Class::Space | Class::Other)
    }
}

/// The class of each byte value; `None` for bytes that are not ASCII.
const CLASSES: [Option<Class>; 256] = {
    let mut classes = [None; 256];
    let mut byte = 0;
    while byte < 0x80 {
        classes[byte] = Some(match byte as u8 {
            b'A'..=b'Z' => Class::Upper,
            b'a'..=b'z' => Class::Lower,
            b'0'..=b'9' => Class::Digit,
            b'\r' | b'\n' => Class::Newline,
            b' ' | b'\t' | 0x0B | 0x0C => Class::Space,
            _ => Class::Other,
        });
        byte += 1;
    }
    classes
};

/// The class of the byte at `at`; `None` when it is not ASCII.
fn class(bytes: &[u8], at: usize) -> Option<Class> {
    match bytes.get(at) {
        Some(&byte) => CLASSES[usize::from(byte)],
        None => Some(Class::End),
    }
}

/// The first index at or after `from` whose class `keep` refuses; `None` when that byte is
/// not ASCII (it might have been kept).
fn run_end(bytes: &[u8], from: usize, keep: impl Fn(Class) -> bool) -> Option<usize> {
    let mut at = from;
    loop {
        let class = class(bytes, at)?;
        if class == Class::End || !keep(class) {
            return Some(at);
        }
        at += 1;
    }
}

/// The end of the contraction (`(?i:'s|'t|'re|'ve|'m|'ll|'d)`) that starts at `at`, if one
/// does: `Some(None)` when none does, `None` when telling needs a byte that is not ASCII.
fn contraction_end(bytes: &[u8], at: usize) -> Option<Option<usize>> {
    if bytes.get(at) != Some(&b'\'') {
        return Some(None);
    }
    let lower = |at: usize| -> Option<u8> {
        match bytes.get(at) {
            Some(byte) if *byte >= 0x80 => None,
            Some(byte) => Some(byte.to_ascii_lowercase()),
            None => Some(0),
        }
    };
    Some(match lower(at + 1)? {
        b's' | b't' | b'm' | b'd' => Some(at + 2),
        b'r' if lower(at + 2)? == b'e' => Some(at + 3),
        b'v' if lower(at + 2)? == b'e' => Some(at + 3),
        b'l' if lower(at + 2)? == b'l' => Some(at + 3),
        _ => None,
    })
}

/// The end of the digits piece (`\p{N}{1,3}`) that starts at `start`.
fn digits_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start;
    while at < start + 3 {
        match class(bytes, at)? {
            Class::Digit => at += 1,
            _ => break,
        }
    }
    Some(at)
}

/// The end of the punctuation piece (` ?[^\s\p{L}\p{N}]+` then any of `trailing`) that
/// starts at `start`, if one does.
fn punctuation_end(
    bytes: &[u8],
    start: usize,
    first: Class,
    trailing: &[u8],
) -> Option<Option<usize>> {
    let from = if first == Class::Other {
        start
    } else if bytes[start] == b' ' && class(bytes, start + 1)? == Class::Other {
        start + 1
    } else {
        return Some(None);
    };
    let mut end = run_end(bytes, from, |class| class == Class::Other)?;
    // A byte that is not ASCII is none of the trailing ones, so it simply ends the piece.
    while bytes.get(end).is_some_and(|byte| trailing.contains(byte)) {
        end += 1;
    }
    Some(Some(end))
}

/// The end of the white-space piece that starts at `start`: `\s*[\r\n]+`, else `\s+$`,
/// else `\s+(?!\S)`, else `\s+`.
fn space_end(bytes: &[u8], start: usize) -> Option<usize> {
    let run = run_end(bytes, start, Class::is_space)?;
    if let Some(newline) = bytes[start..run]
        .iter()
        .rposition(|byte| matches!(byte, b'\r' | b'\n'))
    {
        return Some(start + newline + 1);
    }
    if run == bytes.len() || run - start == 1 {
        return Some(run);
    }
    Some(run - 1)
}

/// The end of the `cl100k_base` piece that starts at `start` (`start` is inside the text):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, tried in that order. `None` when it
/// needs a byte that is not ASCII.
fn cl100k_piece_end(bytes: &[u8], start: usize) -> Option<usize> {
    let first = class(bytes, start)?;
    if let Some(end) = contraction_end(bytes, start)? {
        return Some(end);
    }
    if first.is_letter() {
        return run_end(bytes, start, Class::is_letter);
    }
    if first.is_letter_prefix() && class(bytes, start + 1)?.is_letter() {
        return run_end(bytes, start + 1, Class::is_letter);
    }
    if first == Class::Digit {
        return digits_end(bytes, start);
    }
    if let Some(end) = punctuation_end(bytes, start, first, b"\r\n")? {
        return Some(end);
    }
    space_end(bytes, start)
}

/// The end of the `o200k_base` piece that starts at `start`: a word (an optional
/// `[^\r\n\p{L}\p{N}]`, upper-case letters, lower-case letters, at least one letter in
/// all, then an optional contraction), `\p{N}{1,3}`, ` ?[^\s\p{L}\p{N}]+[\r\n/]*`, or white
/// space as `cl100k_base` cuts it. For ASCII the pattern's two word alternatives both come
/// to that word: the first takes it when it has a lower-case letter, the second otherwise.
fn o200k_piece_end(bytes: &[u8], start: usize) -> Option<usize> {
    let first = class(bytes, start)?;
    let word_start = if first.is_letter() {
        Some(start)
    } else if first.is_letter_prefix() && class(bytes, start + 1)?.is_letter() {
        Some(start + 1)
    } else {
        None
    };
    if let Some(word_start) = word_start {
        let upper_end = run_end(bytes, word_start, |class| class == Class::Upper)?;
        let lower_end = run_end(bytes, upper_end, |class| class == Class::Lower)?;
        return Some(contraction_end(bytes, lower_end)?.unwrap_or(lower_end));
    }
    if first == Class::Digit {
        return digits_end(bytes, start);
    }
    if let Some(end) = punctuation_end(bytes, start, first, b"\r\n/")? {
        return Some(end);
    }
    space_end(bytes, start)
}

/// Which encoding's pattern cuts the pieces.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pattern {
    Cl100k,
    O200k,
}

impl Pattern {
    /// The pattern's regex, built on first use (ASCII text never needs it).
    fn regex(self) -> &'static PatternRegex {
        static CL100K: LazyLock<PatternRegex> = LazyLock::new(|| {
            PatternRegex::new(&[
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+$",
            ])
        });
        static O200K: LazyLock<PatternRegex> = LazyLock::new(|| {
            PatternRegex::new(&[
                "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
                "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
                "\\p{N}{1,3}",
                " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
                "\\s*[\\r\\n]+",
                "\\s+$",
            ])
        });
        match self {
            Pattern::Cl100k => &CL100K,
            Pattern::O200k => &O200K,
        }
    }
}

/// An encoding's published pattern, with its one look-ahead rewritten: the patterns end in
/// `\s+(?!\S)` (white space not followed by a non-space), which the regex engine cannot
/// run. It is the same as `\s+\s` with the last character given back (or `\s+` at the
/// end of the text, which the plain `\s+` alternative after it covers). The three are
/// tried as one regex with several patterns, which reports which one matched: faster than
/// capture groups.
pub(super) struct PatternRegex {
    regex: Regex,
}

/// The index of the look-ahead pattern among [`PatternRegex`]'s three.
const LOOKAHEAD_PATTERN: usize = 1;

impl PatternRegex {
    fn new(first: &[&str]) -> PatternRegex {
        let first = first.join("|");
        let patterns = [first.as_str(), "\\s+\\s", "\\s+"];
        // The patterns are fixed and tested; they cannot fail to build.
        let regex = Regex::new_many(&patterns).expect("the encoding's pattern is a valid regex");
        PatternRegex { regex }
    }

    /// The piece `text` starts with (all of it when nothing matches, which the patterns
    /// never allow on a text that is not empty).
    fn first_piece<'a>(&self, text: &'a str) -> &'a str {
        let input = Input::new(text).anchored(Anchored::Yes);
        let Some(found) = self.regex.find(input) else {
            return text;
        };
        let mut end = found.end();
        if found.pattern().as_usize() == LOOKAHEAD_PATTERN {
            // Give back the look-ahead character; the match is at least two characters.
            end -= text[..end].chars().next_back().map_or(0, char::len_utf8);
        }
        &text[..end]
    }
}

/// The pieces of `text` under `pattern`, exactly as the encoding's regex cuts them.
pub(super) fn pieces(pattern: Pattern, text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let by_hand = match pattern {
            Pattern::Cl100k => cl100k_piece_end(bytes, start),
            Pattern::O200k => o200k_piece_end(bytes, start),
        };
        let end = match by_hand {
            Some(end) => end,
            None => start + pattern.regex().first_piece(&text[start..]).len(),
        };
        let piece = &text[start..end];
        start = end;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(text: &str) {
        for (pattern, tokenizer) in [
            (Pattern::Cl100k, bpe_openai::cl100k_base()),
            (Pattern::O200k, bpe_openai::o200k_base()),
        ] {
            let ours: Vec<&str> = pieces(pattern, text).collect();
            let regex: Vec<&str> = tokenizer.split(text).collect();
            assert_eq!(ours, regex, "{pattern:?} {text:?}");
        }
    }

    #[test]
    fn tricky_texts_are_cut_as_the_regex_cuts_them() {
        for text in [
            "",
            "hello world",
            "  hello   world  ",
            "don't DON'T they'll We'RE I'd it's 'sad 'll 'x",
            "HelloWorld HELLOworld helloWORLD ABC'S abc'S",
            "12345 1 12 123 1234567 3.14159 x1y22z333",
            "a\n\nb\r\n\r\nc \n d\t\te  \n  \n  f",
            "...!!! ?? ?\n/x a/b //c \n/\n/ :) ;-) <tag attr=\"v\">",
            "\x0b\x0c\x1c\x1d\x1e\x1f\x7f\x00 a\x1fb \x1f c",
            "trailing   ",
            "trailing\n  ",
            " ",
            "\n",
            "'",
            "' s",
            "naïve café — “quoted” ſ 'ſ 'ſt K 'K ² 12³ \u{a0}x \u{85}y  \u{a0}",
            "日本語のテキスト、絵文字 🎉🎉 and code: fn main() { println!(\"hi\"); }",
            "x\u{301}y A\u{301}b 'é é'",
        ] {
            check(text);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4_000))]

        #[test]
        fn ascii_texts_are_cut_as_the_regex_cuts_them(text in "[\\x00-\\x7f]{0,80}") {
            check(&text);
        }

        #[test]
        fn ascii_words_and_spaces_are_cut_as_the_regex_cuts_them(
            text in "([a-zA-Z]{1,6}|[0-9]{1,5}|'[sStTdDmM]|'(re|ve|ll|RE|Ve|lL)|[ \\t\\r\\n]{1,4}|[.,;:!?/'\"()-]{1,3}){0,24}"
        ) {
            check(&text);
        }

        #[test]
        fn mixed_texts_are_cut_as_the_regex_cuts_them(
            text in "([a-zA-Z' \\t\\r\\n0-9./]|é|ſ|K|²|\u{a0}|\u{85}|\u{3000}|\u{301}|日|🎉|Ⅻ|ǅ|ʰ){0,48}"
        ) {
            check(&text);
        }
    }
}
