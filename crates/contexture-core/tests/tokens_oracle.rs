//! Exactness of token counting against tiktoken-rs, the reference port of OpenAI's tiktoken.
//!
//! `Encoding::count` and `Encoding::encode` (bpe-openai, tables compiled into the binary) must
//! give the same tokens as tiktoken-rs' `encode_ordinary` for both shipped encodings, on a
//! table of texts known to trip tokenizers up and on random strings (100,000 of them drawn
//! from ASCII and every Unicode general category); and the chat recipe of
//! `TokenCounter::count_request` must give what tiktoken-rs' own chat helper gives.

use contexture_core::{Encoding, Message, Role, TokenCounter};
use proptest::prelude::*;
use tiktoken_rs::{ChatCompletionRequestMessage, CoreBPE, num_tokens_from_messages};
use unicode_general_category::get_general_category;

fn oracle(encoding: Encoding) -> &'static CoreBPE {
    match encoding {
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
    }
}

/// Asserts that both the count and the token ids agree with tiktoken-rs.
fn assert_same(encoding: Encoding, text: &str) -> Result<(), TestCaseError> {
    let expected = oracle(encoding).encode_ordinary(text);
    prop_assert_eq!(
        encoding.count(text),
        expected.len(),
        "{} count of {:?}",
        encoding,
        text
    );
    prop_assert_eq!(
        encoding.encode(text),
        expected,
        "{} tokens of {:?}",
        encoding,
        text
    );
    Ok(())
}

fn tricky_texts() -> Vec<String> {
    let mut texts: Vec<String> = [
        "",
        " ",
        "  ",
        "\n",
        "\r\n",
        "\r\n\r\n",
        "line one\r\nline two\r\n",
        "\r",
        "\t",
        "hello world",
        "Hello, World!",
        "   leading spaces",
        "trailing spaces   ",
        "trailing newline spaces  \n  ",
        "tabs\t\tand\tspaces \t ",
        "a\n\n\nb",
        "   \n   \n",
        " \u{a0}non-breaking\u{a0} \u{2003}em space\u{3000}ideographic space",
        "12345678901234567890123456789",
        "3.14159265358979323846264338327950288419716939937510",
        "1,000,000.00 and 1_000_000 and 0x7fffffff and 1e-9",
        "I'm you're he'll they'd we've it's don't",
        "I'M YOU'RE HE'LL THEY'D WE'VE IT'S DON'T",
        "'s 's 'S ''s rock'n'roll o'clock",
        "naïve café résumé façade",
        "combining e\u{301} a\u{308} n\u{303}",
        "日本語のテキスト、漢字とかなカナ。",
        "中文文本测试，标点符号！还有“引号”。",
        "한국어 텍스트입니다",
        "Ελληνικά και Кириллица и ещё",
        "العربية نص مع أرقام ١٢٣",
        "עברית עם ניקוד",
        "हिन्दी पाठ",
        "ไทย ภาษา",
        "emoji 🦀🚀👍🏽 family 👨\u{200d}👩\u{200d}👧\u{200d}👦 flags 🇫🇷🇯🇵",
        "🦀🦀🦀🦀🦀🦀🦀🦀",
        "zero\u{200b}width\u{200c}non\u{200d}joiner",
        "\u{feff}byte order mark",
        "ﬁ ligature ＡＢＣ fullwidth ¹²³ superscripts",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙",
        "control \u{0} \u{1} \u{1b}[31mred\u{1b}[0m",
        "<|endoftext|> <|im_start|>user<|im_end|> <|fim_prefix|>",
        "https://example.com/a/b?q=1&r=two#frag",
        "user@example.com, +1 (555) 010-9999",
        "snake_case_identifier camelCaseIdentifier SCREAMING_CASE kebab-case",
        "!!!???...;;;:::---___===+++***",
        "fn main() {\n    let x: Vec<u32> = (0..10).collect();\n    println!(\"{x:?}\");\n}\n",
        "def f(x):\n\tif x:\n\t\treturn [i ** 2 for i in range(x)]\n\treturn None\n",
        "{\"key\": [1, 2.5, null, true], \"nested\": {\"k\": \"v\"}}",
        "<div class=\"a\">\n  <p>Text &amp; more</p>\n</div>",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "    indented by four\n        by eight\n",
        "mixed\u{0085}next line\u{2028}line sep\u{2029}para sep",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    texts.push("a".repeat(2000));
    texts.push(" ".repeat(257));
    texts.push("\n".repeat(64));
    texts.push("\r\n".repeat(40));
    texts.push("9".repeat(1001));
    texts.push("1234567890".repeat(50));
    texts.push("ab ".repeat(300));
    texts.push("🦀".repeat(300));
    texts.push("漢".repeat(500));
    texts.push(" \n".repeat(100) + "end");
    texts
}

#[test]
fn tricky_texts_match_tiktoken() {
    for encoding in Encoding::ALL {
        for text in tricky_texts() {
            if let Err(failure) = assert_same(encoding, &text) {
                panic!("{failure}");
            }
        }
    }
}

#[test]
fn whole_source_files_match_tiktoken() {
    let sources = [
        include_str!("../src/tokens.rs"),
        include_str!("../src/message.rs"),
        include_str!("../src/format/openai.rs"),
        include_str!("data/formats/anthropic_multimodal.json"),
    ];
    for encoding in Encoding::ALL {
        for source in sources {
            if let Err(failure) = assert_same(encoding, source) {
                panic!("{failure}");
            }
        }
    }
}

/// Characters that matter to the pre-tokenizer: letters of several scripts, digits,
/// apostrophes, whitespace of every kind, punctuation, emoji, combining marks.
const ALPHABET: &str = "[a-zA-Z0-9'’ \\t\\n\\r\\u{a0}\\u{3000}.,!?;:()\\[\\]{}<>\"_/\\\\=+*&#@$%^|~`\\-éüßçñøÆ\\u{301}\\u{308}日本語中文한국ไทยКиΩ🦀🚀👍\\u{1F3FD}\\u{200d}]{0,80}";

/// Characters of each Unicode general category (up to 512 of each, spread over the
/// category's code points), so that random strings reach every category, the rare ones
/// included.
fn category_samples() -> &'static [Vec<char>] {
    static SAMPLES: std::sync::OnceLock<Vec<Vec<char>>> = std::sync::OnceLock::new();
    SAMPLES.get_or_init(|| {
        let mut by_category: std::collections::BTreeMap<&'static str, Vec<char>> =
            std::collections::BTreeMap::new();
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let category = get_general_category(c).abbreviation();
            by_category.entry(category).or_default().push(c);
        }
        by_category
            .into_values()
            .map(|chars| {
                let step = chars.len().div_ceil(512);
                chars.into_iter().step_by(step).collect()
            })
            .collect()
    })
}

/// Mostly ASCII (where counting cuts pieces without the regex), with characters of every
/// general category in between (where it hands pieces to the regex).
fn every_category_text() -> impl Strategy<Value = String> {
    let categories = category_samples().len();
    let ascii = (0u8..0x80).prop_map(char::from);
    let any_category =
        (0..categories, any::<prop::sample::Index>()).prop_map(|(category, index)| {
            let chars = &category_samples()[category];
            chars[index.index(chars.len())]
        });
    prop::collection::vec(prop_oneof![3 => ascii, 1 => any_category], 0..40)
        .prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100_000))]

    #[test]
    fn random_strings_of_every_unicode_category_match_tiktoken(text in every_category_text()) {
        for encoding in Encoding::ALL {
            assert_same(encoding, &text)?;
        }
    }
}

#[test]
fn every_general_category_is_sampled() {
    // Surrogates are not `char`s; every other category has characters.
    assert_eq!(category_samples().len(), 29);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn random_tokenizer_alphabet_strings_match_tiktoken(text in ALPHABET) {
        for encoding in Encoding::ALL {
            assert_same(encoding, &text)?;
        }
    }

    #[test]
    fn random_unicode_strings_match_tiktoken(text in any::<String>()) {
        for encoding in Encoding::ALL {
            assert_same(encoding, &text)?;
        }
    }

    #[test]
    fn chat_recipe_matches_tiktoken_helper(
        turns in prop::collection::vec(
            (0usize..4, ALPHABET, prop::option::of("[a-zA-Z0-9_]{1,16}")),
            1..6,
        )
    ) {
        let roles = [Role::System, Role::User, Role::Assistant, Role::Developer];
        let messages: Vec<Message> = turns
            .iter()
            .map(|(role, text, name)| {
                let message = Message::new(roles[*role], text.as_str());
                match name {
                    Some(name) => message.with_name(name.as_str()),
                    None => message,
                }
            })
            .collect();
        let oracle_messages: Vec<ChatCompletionRequestMessage> = messages
            .iter()
            .map(|message| ChatCompletionRequestMessage {
                role: message.role.as_str().to_owned(),
                content: Some(message.text()),
                name: message.name.clone(),
                ..Default::default()
            })
            .collect();
        for (encoding, model) in [(Encoding::Cl100kBase, "gpt-4"), (Encoding::O200kBase, "gpt-4o")] {
            let expected = num_tokens_from_messages(model, &oracle_messages).unwrap();
            let counted = TokenCounter::exact(encoding).count_request(&messages, &[]);
            prop_assert_eq!(counted.total as usize, expected, "{} {:?}", model, &messages);
        }
    }
}

#[test]
fn chat_recipe_matches_tiktoken_helper_on_cookbook_example() {
    // The conversation of OpenAI's "How to count tokens with tiktoken" cookbook (129 prompt
    // tokens reported by the API for gpt-4).
    let turns: [(Role, &str, Option<&str>); 6] = [
        (
            Role::System,
            "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
            None,
        ),
        (
            Role::System,
            "New synergies will help drive top-line growth.",
            Some("example_user"),
        ),
        (
            Role::System,
            "Things working well together will increase revenue.",
            Some("example_assistant"),
        ),
        (
            Role::System,
            "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
            Some("example_user"),
        ),
        (
            Role::System,
            "Let's talk later when we're less busy about how to do better.",
            Some("example_assistant"),
        ),
        (
            Role::User,
            "This late pivot means we don't have time to boil the ocean for the client deliverable.",
            None,
        ),
    ];
    let messages: Vec<Message> = turns
        .iter()
        .map(|&(role, text, name)| {
            let message = Message::new(role, text);
            match name {
                Some(name) => message.with_name(name),
                None => message,
            }
        })
        .collect();
    let oracle_messages: Vec<ChatCompletionRequestMessage> = turns
        .iter()
        .map(|&(role, text, name)| ChatCompletionRequestMessage {
            role: role.as_str().to_owned(),
            content: Some(text.to_owned()),
            name: name.map(str::to_owned),
            ..Default::default()
        })
        .collect();
    for (encoding, model) in [
        (Encoding::Cl100kBase, "gpt-4"),
        (Encoding::O200kBase, "gpt-4o"),
    ] {
        let expected = num_tokens_from_messages(model, &oracle_messages).unwrap();
        let counted = TokenCounter::exact(encoding)
            .count_request(&messages, &[])
            .total;
        assert_eq!(counted as usize, expected, "{model}");
    }
    let cl100k = TokenCounter::exact(Encoding::Cl100kBase).count_request(&messages, &[]);
    assert_eq!(cl100k.total, 129);
}
