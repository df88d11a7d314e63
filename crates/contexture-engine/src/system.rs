//! The machine's time, ids and identity, for templates: the sources the pure core is given
//!. The core reads no clock and no randomness itself; the CLI, the server
//! and the executor pass these.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use contexture_core::context::dynamic::format_uuid;
use contexture_core::context::{Clock, FixedClock, IdSource, RenderOptions, Timestamp};
use serde_json::Value;

/// The real clock, in UTC.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let unix_seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        Timestamp {
            unix_seconds,
            utc_offset_minutes: 0,
        }
    }
}

/// Random ids from the standard library's randomly keyed hasher (no extra dependency),
/// mixed with a counter and the time so that two ids of one process never repeat.
#[derive(Debug)]
pub struct RandomIds {
    state: RandomState,
    counter: AtomicU64,
}

impl Default for RandomIds {
    fn default() -> Self {
        RandomIds {
            state: RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }
}

impl IdSource for RandomIds {
    fn next_id(&self) -> [u8; 16] {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let a = self.state.hash_one((n, nanos, 0u8));
        let b = self.state.hash_one((n, nanos, 1u8));
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&a.to_le_bytes());
        bytes[8..].copy_from_slice(&b.to_le_bytes());
        bytes
    }
}

/// A fresh id from `ids`, formatted as a UUID.
pub fn new_id(ids: &dyn IdSource) -> String {
    format_uuid(ids.next_id())
}

/// The system variables a render may use: `hostname`, `username`, `os` (and `system_os`,
/// AWorld's name for it), `system_platform`, `working_directory` (each only when it can be
/// found).
pub fn system_variables() -> Vec<(&'static str, String)> {
    let mut variables = vec![
        ("os", std::env::consts::OS.to_owned()),
        ("system_os", std::env::consts::OS.to_owned()),
        (
            "system_platform",
            system_platform(std::env::consts::OS).to_owned(),
        ),
    ];
    let hostname = std::env::var("HOSTNAME").ok().or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
    });
    if let Some(hostname) = hostname.filter(|h| !h.is_empty()) {
        variables.push(("hostname", hostname));
    }
    let user = ["USER", "USERNAME", "LOGNAME"]
        .into_iter()
        .find_map(|name| std::env::var(name).ok().filter(|user| !user.is_empty()))
        .or_else(account_name);
    if let Some(user) = user {
        variables.push(("username", user));
    }
    if let Ok(dir) = std::env::current_dir() {
        variables.push(("working_directory", dir.display().to_string()));
    }
    variables
}

/// The name Python's `platform.system()` gives a system (`Linux`, `Darwin`, `Windows`), which
/// is what AWorld's `system_platform` holds; other systems keep Rust's name.
pub fn system_platform(os: &str) -> &str {
    match os {
        "linux" => "Linux",
        "macos" => "Darwin",
        "windows" => "Windows",
        "freebsd" => "FreeBSD",
        "netbsd" => "NetBSD",
        "openbsd" => "OpenBSD",
        other => other,
    }
}

/// The account this process runs as, when no variable names it (a service started without
/// `USER`): the owner of `/proc/self` looked up in `/etc/passwd`.
#[cfg(unix)]
fn account_name() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    account_in_passwd(&passwd, uid)
}

#[cfg(not(unix))]
fn account_name() -> Option<String> {
    None
}

/// The name of the account `uid` in a `passwd` file's text (`name:x:uid:gid:...` lines).
pub fn account_in_passwd(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty() && !name.starts_with('#')).then(|| name.to_owned())
    })
}

/// The system variables that describe this host: its name, the user the process runs as,
/// and its working directory. A workflow a client sent never sees them (see
/// [`for_client`]); `os` says only which kind of system this is and stays.
pub const HOST_IDENTITY_VARIABLES: [&str; 3] = ["hostname", "username", "working_directory"];

/// `options` without the variables that describe this host ([`HOST_IDENTITY_VARIABLES`]):
/// the render options of a workflow a client sent, which learns nothing about the machine
/// that runs it. A template that names one of them meets the missing-variable policy.
pub fn for_client(mut options: RenderOptions) -> RenderOptions {
    for name in HOST_IDENTITY_VARIABLES {
        options.variables.remove(name);
    }
    options
}

/// Render options with the real clock (or one stopped at `now`, in Unix seconds), random
/// ids and the system variables.
pub fn render_options(now: Option<i64>) -> RenderOptions {
    let clock: Arc<dyn Clock> = match now {
        Some(seconds) => Arc::new(FixedClock::utc(seconds)),
        None => Arc::new(SystemClock),
    };
    let mut options = RenderOptions::new(clock, Arc::new(RandomIds::default()));
    for (name, value) in system_variables() {
        options = options.with_variable(name, Value::String(value));
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_are_named_as_python_names_them() {
        for (os, name) in [
            ("linux", "Linux"),
            ("macos", "Darwin"),
            ("windows", "Windows"),
            ("solaris", "solaris"),
        ] {
            assert_eq!(system_platform(os), name);
        }
        let variables = system_variables();
        assert!(variables.iter().any(|(name, _)| *name == "system_platform"));
    }

    #[test]
    fn an_account_is_found_by_its_uid() {
        let passwd = "# comment:x:0:0\nroot:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\nbroken line\nada:x:1000:1000:Ada:/home/ada:/bin/sh\n";
        assert_eq!(account_in_passwd(passwd, 0).as_deref(), Some("root"));
        assert_eq!(account_in_passwd(passwd, 1000).as_deref(), Some("ada"));
        assert_eq!(account_in_passwd(passwd, 42), None);
        assert_eq!(account_in_passwd("", 0), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_an_account() {
        // The account comes from the system, whatever the environment says.
        assert!(account_name().is_some_and(|name| !name.is_empty()));
    }
}
