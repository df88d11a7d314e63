//! The start of what a server's program writes on its standard error, kept for errors.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt};

/// The most bytes of a program's standard error kept: enough for a traceback's start.
const KEPT_BYTES: usize = 4000;

/// The start of a program's standard error, filled by a task that reads the pipe to its
/// end (the rest is read and dropped, so a chatty program never blocks on a full pipe).
#[derive(Debug, Clone, Default)]
pub(crate) struct StderrStart {
    kept: Arc<Mutex<Vec<u8>>>,
}

impl StderrStart {
    /// Starts reading `pipe` on the runtime.
    pub(crate) fn read(pipe: impl AsyncRead + Unpin + Send + 'static) -> StderrStart {
        let start = StderrStart::default();
        let kept = start.kept.clone();
        tokio::spawn(async move {
            let mut pipe = pipe;
            let mut buffer = [0u8; 4096];
            loop {
                match pipe.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(read) => {
                        let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                        let room = KEPT_BYTES.saturating_sub(kept.len());
                        kept.extend_from_slice(&buffer[..read.min(room)]);
                    }
                }
            }
        });
        start
    }

    /// What was kept, trimmed; `None` when the program wrote nothing (yet).
    pub(crate) fn text(&self) -> Option<String> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let text = String::from_utf8_lossy(&kept).trim().to_owned();
        (!text.is_empty()).then_some(text)
    }
}
