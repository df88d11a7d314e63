//! The numbers of a request record that follow from its other fields, stored as a mark
//! instead of again.
//!
//! A chat turn's record counts its request several times over: the breakdown's `used` is the
//! sum of its parts and `remaining` the limit less `used`; the budget's `input_tokens` and the
//! fit's `tokens_before` and `tokens_after` are `used` again unless the fit left something
//! out. A record stores the numbers that equal what they follow from as one bitmask (its
//! `"d"` key, see [`Derived`]) and leaves them out; a read puts them back. A number that does
//! not equal its derivation (a fit that trimmed, a budget counted apart) is stored as it is.

use serde_json::{Map, Value};

/// A number of a record's fields that follows from others: its object, its key, and how it
/// is worked out from the record's fields (`None` when what it follows from is missing).
struct Rule {
    object: &'static str,
    key: &'static str,
    derive: fn(&Map<String, Value>) -> Option<Value>,
}

/// The parts of a breakdown whose sum is its `used`.
const BREAKDOWN_PARTS: [&str; 6] = [
    "system",
    "tools",
    "pinned",
    "summary",
    "messages",
    "reply_priming",
];

/// A number of the record's breakdown.
fn breakdown_number(fields: &Map<String, Value>, key: &str) -> Option<u64> {
    fields.get("breakdown")?.get(key)?.as_u64()
}

fn sum_of_parts(fields: &Map<String, Value>) -> Option<Value> {
    let mut sum: u64 = 0;
    for part in BREAKDOWN_PARTS {
        sum = sum.checked_add(breakdown_number(fields, part)?)?;
    }
    Some(sum.into())
}

fn limit_less_used(fields: &Map<String, Value>) -> Option<Value> {
    let limit = i64::try_from(breakdown_number(fields, "limit")?).ok()?;
    let used = i64::try_from(breakdown_number(fields, "used")?).ok()?;
    Some(limit.checked_sub(used)?.into())
}

fn used(fields: &Map<String, Value>) -> Option<Value> {
    breakdown_number(fields, "used").map(Value::from)
}

/// The rules, in the order a read applies them: the later ones follow from `used`, which
/// the first one may have put back.
const RULES: [Rule; 5] = [
    Rule {
        object: "breakdown",
        key: "used",
        derive: sum_of_parts,
    },
    Rule {
        object: "breakdown",
        key: "remaining",
        derive: limit_less_used,
    },
    Rule {
        object: "budget",
        key: "input_tokens",
        derive: used,
    },
    Rule {
        object: "fit",
        key: "tokens_before",
        derive: used,
    },
    Rule {
        object: "fit",
        key: "tokens_after",
        derive: used,
    },
];

/// Which of a record's numbers are stored as following from its others: bit `i` stands for
/// the `i`-th rule (the breakdown's `used`, its `remaining`, the budget's `input_tokens`, the
/// fit's `tokens_before`, its `tokens_after`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Derived(u8);

impl Derived {
    /// Nothing derived: every number stored as it is (every record written before derived
    /// numbers were).
    pub(crate) const NONE: Derived = Derived(0);

    /// The numbers of `fields`, a record's fields whole, that equal what they follow from.
    pub(crate) fn of(fields: &Map<String, Value>) -> Derived {
        let mut bits = 0;
        for (bit, rule) in RULES.iter().enumerate() {
            let held = fields
                .get(rule.object)
                .and_then(|object| object.get(rule.key));
            if held.is_some() && held == (rule.derive)(fields).as_ref() {
                bits |= 1 << bit;
            }
        }
        Derived(bits)
    }

    /// Reads the stored mark.
    pub(crate) fn from_stored(mark: &Value) -> Result<Derived, String> {
        mark.as_u64()
            .filter(|bits| *bits < 1 << RULES.len())
            .map(|bits| Derived(bits as u8))
            .ok_or_else(|| format!("`d` is {mark}, not a mark of derived numbers"))
    }

    /// The mark as stored, when anything is derived.
    pub(crate) fn to_stored(self) -> Option<Value> {
        (self != Derived::NONE).then(|| Value::from(self.0))
    }

    fn rules(self) -> impl Iterator<Item = &'static Rule> {
        RULES
            .iter()
            .enumerate()
            .filter(move |(bit, _)| self.0 & (1 << bit) != 0)
            .map(|(_, rule)| rule)
    }

    /// Leaves the derived numbers out of `fields`: a record's fields whole, or a change of
    /// an earlier record's (a JSON merge patch), where an object left empty is left out too
    /// (it changes nothing).
    pub(crate) fn strip(self, fields: &mut Map<String, Value>, is_change: bool) {
        for rule in self.rules() {
            let Some(Value::Object(object)) = fields.get_mut(rule.object) else {
                continue;
            };
            object.remove(rule.key);
            if is_change && object.is_empty() {
                fields.remove(rule.object);
            }
        }
    }

    /// Puts the derived numbers back into `fields`, a record's fields whole.
    pub(crate) fn restore(self, fields: &mut Map<String, Value>) -> Result<(), String> {
        for rule in self.rules() {
            let value = (rule.derive)(fields).ok_or_else(|| {
                format!(
                    "`{}.{}` is derived, but what it follows from is not stored",
                    rule.object, rule.key
                )
            })?;
            match fields.get_mut(rule.object) {
                Some(Value::Object(object)) => {
                    object.insert(rule.key.to_string(), value);
                }
                _ => {
                    return Err(format!(
                        "`{}.{}` is derived, but the record has no `{}`",
                        rule.object, rule.key, rule.object
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(fields) => fields,
            _ => unreachable!(),
        }
    }

    fn chat_turn() -> Map<String, Value> {
        fields(json!({
            "request_id": "r",
            "budget": {"context_window": 128000, "max_output_tokens": 1000, "input_tokens": 13310},
            "breakdown": {
                "model": "m", "exact": true, "encoding": "o200k_base",
                "context_window": 128000, "budget_ratio": 0.9, "usable": 115200,
                "reserve_output": 3584, "limit": 111616,
                "system": 0, "tools": 0, "pinned": 0, "summary": 0, "messages": 13300,
                "reply_priming": 10, "used": 13310, "remaining": 98306
            },
            "fit": {"limit": 111616, "tokens_before": 13310, "tokens_after": 13310}
        }))
    }

    #[test]
    fn a_turn_that_kept_everything_stores_none_of_its_repeated_numbers() {
        let whole = chat_turn();
        let derived = Derived::of(&whole);
        assert_eq!(derived, Derived(0b11111));
        let mut stored = whole.clone();
        derived.strip(&mut stored, false);
        assert_eq!(stored["breakdown"].get("used"), None);
        assert_eq!(stored["breakdown"].get("remaining"), None);
        assert_eq!(stored["budget"].get("input_tokens"), None);
        assert_eq!(stored["fit"], json!({"limit": 111616}));
        derived.restore(&mut stored).unwrap();
        assert_eq!(stored, whole);
    }

    #[test]
    fn numbers_that_differ_from_their_derivation_are_stored() {
        // A fit that left messages out, a budget counted on its own, an over-limit request.
        let mut whole = chat_turn();
        whole["fit"]["tokens_before"] = json!(20000);
        whole["budget"]["input_tokens"] = json!(13311);
        whole["breakdown"]["messages"] = json!(200000);
        whole["breakdown"]["used"] = json!(200010);
        whole["breakdown"]["remaining"] = json!(111616 - 200010);
        whole["fit"]["tokens_after"] = json!(200010);
        let derived = Derived::of(&whole);
        assert_eq!(
            derived,
            Derived(0b10011),
            "used, remaining (negative), tokens_after"
        );
        let mut stored = whole.clone();
        derived.strip(&mut stored, false);
        assert_eq!(stored["fit"]["tokens_before"], json!(20000));
        assert_eq!(stored["budget"]["input_tokens"], json!(13311));
        derived.restore(&mut stored).unwrap();
        assert_eq!(stored, whole);
    }

    #[test]
    fn records_without_the_objects_derive_nothing() {
        let whole = fields(json!({"request_id": "r", "model": "m"}));
        assert_eq!(Derived::of(&whole), Derived::NONE);
        assert_eq!(Derived::NONE.to_stored(), None);
        // A breakdown missing a part (an older or foreign shape) derives nothing either.
        let mut partial = chat_turn();
        partial["breakdown"]
            .as_object_mut()
            .unwrap()
            .remove("pinned");
        assert_eq!(Derived::of(&partial), Derived(0b11110), "all but `used`");
    }

    #[test]
    fn a_change_drops_the_objects_it_empties() {
        let mut change = fields(json!({
            "request_id": "r2",
            "budget": {"input_tokens": 13416},
            "breakdown": {"messages": 13406, "used": 13416, "remaining": 98200},
            "fit": {"tokens_before": 13416, "tokens_after": 13416}
        }));
        Derived(0b11111).strip(&mut change, true);
        assert_eq!(
            Value::Object(change),
            json!({"request_id": "r2", "breakdown": {"messages": 13406}})
        );
    }

    #[test]
    fn bad_marks_and_missing_sources_are_errors() {
        for mark in [json!(32), json!(-1), json!("3"), json!(1.5)] {
            let error = Derived::from_stored(&mark).unwrap_err();
            assert!(error.contains("not a mark of derived numbers"), "{error}");
        }
        assert_eq!(Derived::from_stored(&json!(31)), Ok(Derived(31)));
        let mut no_breakdown = fields(json!({"request_id": "r", "budget": {}}));
        let error = Derived(0b100).restore(&mut no_breakdown).unwrap_err();
        assert!(
            error.contains("`budget.input_tokens` is derived"),
            "{error}"
        );
        let mut no_fit = chat_turn();
        no_fit.remove("fit");
        let error = Derived(0b1000).restore(&mut no_fit).unwrap_err();
        assert!(error.contains("the record has no `fit`"), "{error}");
    }
}
