//! How an LLM call's end is recorded (`request_ended`), shared by the executor's calls, the
//! summarizer's and a chat turn's.

use contexture_core::Message;
use contexture_core::registry::ModelInfo;
use contexture_core::thread::{RequestEnd, RequestOutcome, Usage};
use contexture_llm::{ChatResponse, LlmError};

/// The record of a call's end: the reply as received, the provider's usage (or, when it
/// reported none, `input_tokens` and the reply counted here, marked estimated), the cost at
/// the model's list price, the attempts; or the error.
pub(crate) fn request_end(
    request_id: &str,
    response: &Result<ChatResponse, LlmError>,
    model: &ModelInfo,
    input_tokens: u32,
) -> RequestEnd {
    match response {
        Ok(response) => {
            let usage = response.usage;
            let mut end = answered_end(request_id, &response.message, usage, model, input_tokens);
            end.reply = Some(response.message.clone());
            end.finish_reason = response.finish_reason.clone();
            end.attempts = (response.attempts > 1).then_some(response.attempts);
            end
        }
        Err(error) => RequestEnd::failed(request_id, error.to_string()),
    }
}

/// The record of a call answered with `reply` (which it does not hold: a caller that records
/// the reply sets it): the provider's `usage`, or when it reported none, `input_tokens` and
/// the reply counted with the model's tokenizer (marked estimated); and the cost at the
/// model's list price, when it has one.
pub(crate) fn answered_end(
    request_id: &str,
    reply: &Message,
    usage: Option<Usage>,
    model: &ModelInfo,
    input_tokens: u32,
) -> RequestEnd {
    let (usage, estimated) = match usage {
        Some(usage) => (usage, false),
        None => (
            Usage::new(
                u64::from(input_tokens),
                u64::from(model.counter.count_message(reply)),
            ),
            true,
        ),
    };
    priced_end(
        request_id,
        RequestOutcome::Completed,
        usage,
        estimated,
        model,
    )
}

/// The record of a call's end with `outcome` and `usage` (`estimated` when counted here, not
/// reported), and the cost of that usage at the model's list price, when it has one.
pub(crate) fn priced_end(
    request_id: &str,
    outcome: RequestOutcome,
    usage: Usage,
    estimated: bool,
    model: &ModelInfo,
) -> RequestEnd {
    let mut end = RequestEnd::new(request_id, outcome, usage);
    end.usage_estimated = estimated;
    end.cost_usd = model
        .pricing
        .map(|pricing| pricing.cost(usage.input_tokens, usage.output_tokens));
    end
}
