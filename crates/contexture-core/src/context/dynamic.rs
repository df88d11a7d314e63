//! Dynamic template variables (`current_date`, `uuid`, ...) and the sources they come from.
//!
//! The core reads no clock and no randomness: a render is given a [`Clock`] and an
//! [`IdSource`]. The CLI passes the system clock and random ids; tests pass [`FixedClock`] and
//! [`FixedIds`], so every render is reproducible.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

/// A moment: seconds since the Unix epoch (UTC) and the local offset to show it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Timestamp {
    /// Seconds since 1970-01-01T00:00:00Z.
    pub unix_seconds: i64,
    /// Offset of local time from UTC, in minutes (0 for UTC).
    pub utc_offset_minutes: i32,
}

/// Where the current time comes from.
pub trait Clock: Send + Sync {
    /// The current moment.
    fn now(&self) -> Timestamp;
}

/// Where fresh ids come from: 16 random (or, in tests, predictable) bytes per call.
pub trait IdSource: Send + Sync {
    /// The bytes of a new id; they are formatted as a version-4 UUID.
    fn next_id(&self) -> [u8; 16];
}

/// A clock stopped at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedClock(pub Timestamp);

impl FixedClock {
    /// A clock stopped at `unix_seconds`, in UTC.
    pub fn utc(unix_seconds: i64) -> FixedClock {
        FixedClock(Timestamp {
            unix_seconds,
            utc_offset_minutes: 0,
        })
    }
}

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        self.0
    }
}

/// Predictable ids: a counter starting at a seed, so the n-th id of a run is always the same.
#[derive(Debug, Default)]
pub struct FixedIds {
    next: AtomicU64,
}

impl FixedIds {
    /// Ids counting up from `seed`.
    pub fn starting_at(seed: u64) -> FixedIds {
        FixedIds {
            next: AtomicU64::new(seed),
        }
    }
}

impl IdSource for FixedIds {
    fn next_id(&self) -> [u8; 16] {
        let n = self.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let mut bytes = [0u8; 16];
        bytes[8..].copy_from_slice(&n.to_be_bytes());
        bytes[..8].copy_from_slice(&n.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
        bytes
    }
}

/// Formats 16 bytes as a version-4, variant-1 UUID (`xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`).
pub fn format_uuid(mut bytes: [u8; 16]) -> String {
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The names of the dynamic variables, in documentation order.
pub const DYNAMIC_VARIABLES: [&str; 11] = [
    "current_date",
    "current_time",
    "current_datetime",
    "current_datetime_plain",
    "current_timestamp",
    "current_weekday",
    "current_month",
    "current_year",
    "uuid",
    "random_uuid",
    "short_uuid",
];

/// The value of dynamic variable `name` at `now`, drawing an id from `ids` when needed;
/// `None` when `name` is not a dynamic variable.
///
/// `current_date` is `YYYY-MM-DD`, `current_time` `HH:MM:SS`, `current_datetime` ISO 8601 with
/// the offset (`2024-05-01T09:30:00+00:00`), `current_datetime_plain` the date and time with a
/// space and no offset (`2024-05-01 09:30:00`, the layout AWorld's `current_datetime` has),
/// `current_timestamp` the Unix seconds (a number), `current_weekday` the English day name,
/// `current_month` the English month name, `current_year` the year (a number), `uuid` and
/// `random_uuid` (AWorld's name for it) a v4 UUID and `short_uuid` its first eight hex
/// digits. All in the clock's local offset.
pub fn dynamic_value(name: &str, now: Timestamp, ids: &dyn IdSource) -> Option<Value> {
    let local = now.unix_seconds + i64::from(now.utc_offset_minutes) * 60;
    let days = local.div_euclid(86_400);
    let secs = local.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let date = format!("{year:04}-{month:02}-{day:02}");
    let time = format!("{h:02}:{m:02}:{s:02}");
    Some(match name {
        "current_date" => Value::String(date),
        "current_time" => Value::String(time),
        "current_datetime" => {
            let offset = now.utc_offset_minutes;
            let sign = if offset < 0 { '-' } else { '+' };
            let offset = offset.unsigned_abs();
            Value::String(format!(
                "{date}T{time}{sign}{:02}:{:02}",
                offset / 60,
                offset % 60
            ))
        }
        "current_datetime_plain" => Value::String(format!("{date} {time}")),
        "current_timestamp" => Value::from(now.unix_seconds),
        "current_month" => {
            const NAMES: [&str; 12] = [
                "January",
                "February",
                "March",
                "April",
                "May",
                "June",
                "July",
                "August",
                "September",
                "October",
                "November",
                "December",
            ];
            Value::String(NAMES[month as usize - 1].to_owned())
        }
        "current_year" => Value::from(year),
        "current_weekday" => {
            const NAMES: [&str; 7] = [
                "Thursday",
                "Friday",
                "Saturday",
                "Sunday",
                "Monday",
                "Tuesday",
                "Wednesday",
            ];
            Value::String(NAMES[days.rem_euclid(7) as usize].to_owned())
        }
        "uuid" | "random_uuid" => Value::String(format_uuid(ids.next_id())),
        "short_uuid" => Value::String(format_uuid(ids.next_id())[..8].to_owned()),
        _ => return None,
    })
}

/// Converts days since 1970-01-01 to a (year, month, day) civil date (Howard Hinnant's
/// algorithm, valid for the whole `i64` day range the clock can produce).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_match_known_moments() {
        let ids = FixedIds::default();
        let at = |secs, offset| Timestamp {
            unix_seconds: secs,
            utc_offset_minutes: offset,
        };
        let v = |name, ts| dynamic_value(name, ts, &ids).unwrap();
        // 2024-02-29T23:59:59Z was a Thursday.
        assert_eq!(v("current_date", at(1_709_251_199, 0)), "2024-02-29");
        assert_eq!(v("current_time", at(1_709_251_199, 0)), "23:59:59");
        assert_eq!(v("current_weekday", at(1_709_251_199, 0)), "Thursday");
        assert_eq!(
            v("current_datetime", at(1_709_251_199, 90)),
            "2024-03-01T01:29:59+01:30"
        );
        assert_eq!(v("current_date", at(0, -60)), "1969-12-31");
        assert_eq!(v("current_timestamp", at(42, 0)), 42);
        // AWorld's names and layout.
        assert_eq!(
            v("current_datetime_plain", at(1_709_251_199, 90)),
            "2024-03-01 01:29:59"
        );
        assert_eq!(v("current_month", at(1_709_251_199, 0)), "February");
        assert_eq!(v("current_month", at(1_709_251_199, 90)), "March");
        assert_eq!(v("current_month", at(0, -60)), "December");
        assert_eq!(v("current_year", at(1_709_251_199, 0)), 2024);
        assert_eq!(v("current_year", at(0, -60)), 1969);
        let uuid = v("random_uuid", at(0, 0));
        assert_eq!(uuid.as_str().unwrap().len(), 36);
        // Every name has a value.
        for name in DYNAMIC_VARIABLES {
            assert!(dynamic_value(name, at(0, 0), &ids).is_some(), "{name}");
        }
        assert_eq!(dynamic_value("current_century", at(0, 0), &ids), None);
    }

    #[test]
    fn uuids_are_version_4_and_predictable() {
        let ids = FixedIds::starting_at(7);
        let a = format_uuid(ids.next_id());
        let b = format_uuid(ids.next_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_eq!(a, format_uuid(FixedIds::starting_at(7).next_id()));
    }
}
