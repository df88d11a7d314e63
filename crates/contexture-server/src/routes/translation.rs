//! An upstream's answer stream written again in a door's own format, piece by piece: the
//! upstream's server-sent events are folded into the answer (which the engine records as
//! they pass) and each piece of text, reasoning or tool call is handed to the door's
//! writer as it arrives, the end (or the failure) once the stream is over.

use bytes::Bytes;
use contexture_core::format::AnswerPieces;
use contexture_llm::StreamDelta;
use contexture_llm::passthrough::{
    Answer, AnswerAccumulator, PassthroughError, UpstreamBody, UpstreamResponse, UpstreamStream,
};
use contexture_llm::wire::WireFormat;
use futures_util::StreamExt;

use crate::error::{ApiError, ApiResult};

/// The answer of `response`, an upstream's, to be written again in a door's own format: its
/// format and body; a refusal (a status that is not success) is the door's own error, with
/// the upstream's status and what it said.
pub(crate) async fn answer_to_write(
    response: UpstreamResponse,
) -> ApiResult<(WireFormat, UpstreamBody)> {
    if !response.is_success() {
        let status = response.status;
        let body = response.body.collect().await.unwrap_or_default();
        return Err(ApiError::upstream_refusal(status, &body));
    }
    Ok((response.format, response.body))
}

/// `upstream`, an answer in the format `accumulator` reads, written by `writer` after
/// `first` (what the door writes before any piece: the stream's opening events); `end`
/// writes the last events from the whole answer, or from why there is none (the stream
/// broke off, or what came could not be read).
pub(crate) fn translated_stream<W, E>(
    upstream: UpstreamStream,
    accumulator: AnswerAccumulator,
    writer: W,
    first: String,
    end: E,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send
where
    W: AnswerPieces + Send + 'static,
    E: FnOnce(&mut W, Result<Answer, PassthroughError>) -> String + Send + 'static,
{
    let rest = futures_util::stream::unfold(
        Some((upstream, accumulator, writer, end)),
        |state| async move {
            let (mut upstream, mut accumulator, mut writer, end) = state?;
            match upstream.next().await {
                Some(Ok(bytes)) => {
                    let mut out = String::new();
                    accumulator.push_sse_bytes_telling(&bytes, &mut |delta| {
                        out.push_str(&match delta {
                            StreamDelta::Text(text) => writer.text(&text),
                            StreamDelta::Reasoning(text) => writer.reasoning(&text),
                            StreamDelta::ToolCall {
                                index,
                                id,
                                name,
                                arguments,
                            } => {
                                writer.tool_call(index, id.as_deref(), name.as_deref(), &arguments)
                            }
                        });
                    });
                    let state = (upstream, accumulator, writer, end);
                    Some((Ok(Bytes::from(out)), Some(state)))
                }
                Some(Err(error)) => Some((Ok(Bytes::from(end(&mut writer, Err(error)))), None)),
                None => {
                    let out = end(&mut writer, accumulator.finish());
                    Some((Ok(Bytes::from(out)), None))
                }
            }
        },
    );
    futures_util::stream::once(async move { Ok(Bytes::from(first)) }).chain(rest)
}
