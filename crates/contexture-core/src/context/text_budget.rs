//! Text a render makes out of values, paid for before it exists.
//!
//! The template engine charges a render's fuel for the data it creates (about one unit per
//! 64 bytes), which bounds its memory, but a few conversions of a value to text charge only
//! after the text is built: printing a list, and the `tojson`, `string`, `pprint` and `join`
//! filters. A list that repeats one long string (`[s] * 100000`) costs little to make and
//! gigabytes to print. Here those conversions first measure the text they would make, with
//! a writer that only counts and stops once the text would cost more than the fuel left,
//! so the text is made only when the fuel can pay for it.

use std::fmt::{self, Write as _};

use minijinja::value::{Kwargs, StringInput, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

/// Bytes of data one unit of fuel pays for.
const BYTES_PER_FUEL: u64 = 64;

/// A writer that only counts what is written, and fails once that passes its limit.
struct Measure {
    written: usize,
    limit: usize,
}

impl Measure {
    fn new(limit: usize) -> Measure {
        Measure { written: 0, limit }
    }

    fn add(&mut self, bytes: usize) -> bool {
        self.written = self.written.saturating_add(bytes);
        self.written <= self.limit
    }
}

impl fmt::Write for Measure {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        if self.add(text.len()) {
            Ok(())
        } else {
            Err(fmt::Error)
        }
    }
}

impl std::io::Write for Measure {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.add(bytes.len()) {
            Ok(bytes.len())
        } else {
            Err(std::io::Error::other("over the render's budget"))
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The bytes of text the render's remaining fuel can pay for (no limit without fuel).
pub(crate) fn bytes_left(state: &State) -> usize {
    state.fuel_levels().map_or(usize::MAX, |(_, remaining)| {
        usize::try_from(remaining.saturating_mul(BYTES_PER_FUEL)).unwrap_or(usize::MAX)
    })
}

/// The engine's own out-of-fuel error, for text the fuel left cannot pay for.
pub(crate) fn out_of_fuel(state: &State) -> Error {
    match state.consume_fuel(u64::MAX) {
        Err(error) => error,
        Ok(()) => Error::new(
            ErrorKind::InvalidOperation,
            "the text would be larger than a render may create",
        ),
    }
}

/// Fails unless the text `write` makes fits in what the render's fuel can pay for.
fn ensure_fits(state: &State, write: impl FnOnce(&mut Measure) -> bool) -> Result<(), Error> {
    let mut measure = Measure::new(bytes_left(state));
    if write(&mut measure) {
        Ok(())
    } else {
        Err(out_of_fuel(state))
    }
}

/// Fails unless `value` printed (`{}`) fits the render's budget.
fn ensure_display_fits(state: &State, value: &Value) -> Result<(), Error> {
    ensure_fits(state, |measure| write!(measure, "{value}").is_ok())
}

/// Replaces the filters that build their text before charging it with ones that measure it
/// first, then do the same work.
pub(crate) fn add_budgeted_filters(env: &mut Environment<'_>) {
    env.add_filter("string", |state: &State, value: Value| {
        ensure_display_fits(state, &value)?;
        minijinja::filters::string(state, &value)
    });
    env.add_filter("pprint", |state: &State, value: Value| {
        ensure_fits(state, |measure| write!(measure, "{value:#?}").is_ok())?;
        Ok::<_, Error>(minijinja::filters::pprint(&value))
    });
    env.add_filter(
        "tojson",
        |state: &State, value: Value, indent: Option<Value>, kwargs: Kwargs| {
            let spaces = match indent
                .as_ref()
                .or(kwargs.peek::<Option<&Value>>("indent").ok().flatten())
            {
                None => None,
                Some(indent) => match bool::try_from(indent.clone()).ok() {
                    Some(true) => Some(2),
                    Some(false) => None,
                    None => usize::try_from(indent.clone()).ok(),
                },
            };
            ensure_json_fits(state, &value, spaces)?;
            minijinja::filters::tojson(&value, indent, kwargs)
        },
    );
    env.add_filter(
        "join",
        |state: &mut State,
         value: Value,
         joiner: Option<Value>,
         attribute: Option<String>,
         kwargs: Kwargs| {
            ensure_join_fits(state, &value, joiner.as_ref())?;
            let joiner = joiner
                .as_ref()
                .map(|joiner| StringInput::new(state, joiner))
                .transpose()?;
            minijinja::filters::join(state, &value, joiner, attribute.as_deref(), kwargs)
        },
    );
}

/// Fails unless `value` as JSON (spaced as the filter writes it, or indented by `indent`
/// spaces) fits the render's budget.
fn ensure_json_fits(state: &State, value: &Value, indent: Option<usize>) -> Result<(), Error> {
    let limit = bytes_left(state);
    let fits = match indent {
        // The filter's spacing adds at most one byte per separator: twice the compact text
        // bounds it.
        None => {
            let mut measure = Measure::new(limit / 2);
            serde_json::to_writer(&mut measure, value).is_ok()
        }
        Some(spaces) if spaces > limit => false,
        Some(spaces) => {
            let indent = " ".repeat(spaces);
            let formatter = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
            let mut measure = Measure::new(limit);
            let mut serializer = serde_json::Serializer::with_formatter(&mut measure, formatter);
            serde::Serialize::serialize(value, &mut serializer).is_ok()
        }
    };
    if fits {
        Ok(())
    } else {
        Err(out_of_fuel(state))
    }
}

/// Fails unless `value`'s items printed one after another, with `joiner` between them, fit
/// the render's budget (an item is measured whole even when an attribute of it is joined).
fn ensure_join_fits(state: &State, value: &Value, joiner: Option<&Value>) -> Result<(), Error> {
    if value.kind() == ValueKind::String {
        // A string is joined character by character: its length times the joiner's.
        let characters = value.as_str().map_or(0, |text| text.chars().count());
        let joiner = joiner.map_or(0, |joiner| joiner.to_string().len());
        let size = characters.saturating_mul(joiner.saturating_add(4));
        return if size <= bytes_left(state) {
            Ok(())
        } else {
            Err(out_of_fuel(state))
        };
    }
    let Ok(items) = value.try_iter() else {
        // Not iterable: the filter reports that itself.
        return Ok(());
    };
    let joiner = joiner.map_or(0, |joiner| joiner.to_string().len());
    ensure_fits(state, |measure| {
        for item in items {
            if !measure.add(joiner) || write!(measure, "{item}").is_err() {
                return false;
            }
        }
        true
    })
}

/// Prints `value` as compact JSON into `out`, failing with the out-of-fuel error as soon as
/// the text passes what the render's fuel can pay for (nothing is built first).
pub(crate) fn write_json(
    out: &mut minijinja::Output<'_>,
    state: &State,
    value: &Value,
) -> Result<(), Error> {
    struct Budgeted<'o, 'w> {
        out: &'o mut minijinja::Output<'w>,
        measure: Measure,
        failed_write: bool,
    }
    impl std::io::Write for Budgeted<'_, '_> {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.measure.write(bytes)?;
            // The serializer writes whole UTF-8 pieces (it splits strings only at escapes).
            let text = std::str::from_utf8(bytes).map_err(std::io::Error::other)?;
            self.out.write_str(text).map_err(|_| {
                self.failed_write = true;
                std::io::Error::other("cannot write output")
            })?;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut writer = Budgeted {
        out,
        measure: Measure::new(bytes_left(state)),
        failed_write: false,
    };
    match serde_json::to_writer(&mut writer, value) {
        Ok(()) => Ok(()),
        Err(_) if writer.failed_write => {
            Err(Error::new(ErrorKind::WriteFailure, "cannot write output"))
        }
        Err(_) if writer.measure.written > writer.measure.limit => Err(out_of_fuel(state)),
        Err(error) => Err(Error::new(ErrorKind::BadSerialization, error.to_string())),
    }
}
