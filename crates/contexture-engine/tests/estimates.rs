//! Estimates that learn, over real HTTP: calls to a model whose tokens are estimated feed
//! its family's calibration with what the provider reported, and later requests are
//! measured with it, never below what was reported; a report that makes no sense is refused;
//! models counted exactly are left alone.

use crate::common;

use common::{events, http_executor, requests, sqlite};
use contexture_engine::executor::{Executor, RunRequest};
use contexture_fake_upstream::{FakeUpstream, Reply};
use contexture_store::Store;

fn workflow(model: &str) -> String {
    format!(
        "assistants: [{{id: a, model: {model}}}]\nstates:\n  - {{id: s, assistant_id: a, task: 'Summarize the text above in one short paragraph, keeping every name and number it gives.', next: {{end: true}}}}\n"
    )
}

const INPUT: &str = "The quarterly report lists revenue of 4.2 million, up 12 percent, with the northern region led by Ana Ruiz growing fastest and the southern region, under Tom Becker, flat. Costs rose 3 percent on new hires.";

/// Runs the workflow once as execution `id`; the input tokens its one request was measured at.
async fn measured<S: Store + Clone>(exec: &Executor<S>, model: &str, id: &str) -> u32 {
    let mut request = RunRequest::new("workflow.yaml", workflow(model), INPUT);
    request.execution_id = Some(id.to_owned());
    exec.start(request).await.expect("the run completes");
    let log = events(exec.store(), id).await;
    requests(&log)[0]
        .budget
        .expect("a budget is recorded")
        .input_tokens
}

#[tokio::test]
async fn reported_usage_calibrates_later_estimates_never_below_what_was_reported() {
    let upstream = FakeUpstream::start().await;
    let (_dir, store) = sqlite().await;
    let exec = http_executor(store.clone(), &upstream.base_url());
    let family = "claude-sonnet-4-5";

    // A report that cannot be right (a tenth of the estimate) is refused: nothing learnt.
    upstream.push(Reply::text("ok").usage(10, 5));
    let estimate = measured(&exec, family, "first").await;
    assert!(estimate >= 32, "the request is big enough to learn from");
    let calibration = store.calibration(family).await.unwrap().unwrap();
    assert_eq!((calibration.kept, calibration.outliers), (0, 1));

    // The provider counts 40% more than the estimate, three times: learnt. (Both sides
    // count the same 3 tokens of reply priming, which scale with nothing.)
    let priming = 3;
    let reported = (f64::from(estimate - priming) * 1.4).round() as u64 + u64::from(priming);
    for n in 0..3 {
        upstream.push(Reply::text("ok").usage(reported, 5));
        assert_eq!(
            measured(&exec, family, &format!("learn-{n}")).await,
            estimate,
            "no factor before three observations are kept"
        );
    }
    let calibration = store.calibration(family).await.unwrap().unwrap();
    assert_eq!(calibration.kept, 3);
    let factor = calibration.factor().expect("a factor");
    let expected = (reported - u64::from(priming)) as f64 / f64::from(estimate - priming);
    assert!((factor - expected).abs() < 1e-9, "{factor} != {expected}");

    // The next request is measured with it: at least what the provider reported, and not
    // far above (each message's estimate is rounded up).
    upstream.push(Reply::text("ok").usage(reported, 5));
    let calibrated = measured(&exec, family, "after").await;
    assert!(
        u64::from(calibrated) >= reported,
        "{calibrated} < reported {reported}"
    );
    assert!(
        u64::from(calibrated) <= reported + 8,
        "{calibrated} far above {reported}"
    );
    // Its observation was measured against the uncalibrated estimate: the factor holds.
    let calibration = store.calibration(family).await.unwrap().unwrap();
    assert_eq!(calibration.kept, 4);
    assert!((calibration.factor().unwrap() - factor).abs() < 0.01);

    // A model counted exactly learns nothing.
    upstream.push(Reply::text("ok").usage(reported * 2, 5));
    measured(&exec, "gpt-4o-mini", "exact").await;
    assert_eq!(store.calibration("gpt-4o-mini").await.unwrap(), None);
}
