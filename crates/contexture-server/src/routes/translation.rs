//! An upstream's answer stream written again in a door's own format, piece by piece: the
//! upstream's server-sent events are folded into the answer (which the engine records as
//! they pass) and each piece of text, reasoning or tool call is handed to the door's
//! writer as it arrives, the end (or the failure) once the stream is over.

use bytes::Bytes;
use contexture_llm::StreamDelta;
use contexture_llm::passthrough::{Answer, AnswerAccumulator, PassthroughError, UpstreamStream};
use futures_util::StreamExt;

/// A door's writer of a stream in its own format.
pub(crate) trait StreamWriter: Send + 'static {
    /// What a piece of the answer is written as.
    fn delta(&mut self, delta: StreamDelta) -> String;

    /// The stream's last events: the whole answer's end, or why there is none (the stream
    /// broke off, or what came could not be read).
    fn end(&mut self, answer: Result<Answer, PassthroughError>) -> String;
}

/// `upstream`, an answer in the format `accumulator` reads, written by `writer` after
/// `first` (what the door writes before any piece: the stream's opening events).
pub(crate) fn translated_stream<W: StreamWriter>(
    upstream: UpstreamStream,
    accumulator: AnswerAccumulator,
    writer: W,
    first: String,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let rest =
        futures_util::stream::unfold(Some((upstream, accumulator, writer)), |state| async move {
            let (mut upstream, mut accumulator, mut writer) = state?;
            match upstream.next().await {
                Some(Ok(bytes)) => {
                    let mut out = String::new();
                    accumulator.push_sse_bytes_telling(&bytes, &mut |delta| {
                        out.push_str(&writer.delta(delta));
                    });
                    Some((Ok(Bytes::from(out)), Some((upstream, accumulator, writer))))
                }
                Some(Err(error)) => Some((Ok(Bytes::from(writer.end(Err(error)))), None)),
                None => {
                    let out = writer.end(accumulator.finish());
                    Some((Ok(Bytes::from(out)), None))
                }
            }
        });
    futures_util::stream::once(async move { Ok(Bytes::from(first)) }).chain(rest)
}
