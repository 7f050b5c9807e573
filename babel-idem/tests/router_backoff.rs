//! The family's retry backoff (ADR-0034 §9) through `Router::dispatch`:
//! `d(n) = min(max, base × multiplier^(n−1))`, no cap when `max` is zero,
//! the same delays as the Python SDK's `retry_delay` (asked through
//! `BABEL_IDEM_PYTHON`, else compared with the formula alone), and full
//! jitter drawn within `[0, d(n)]` from a stream of each worker's own.

mod family_python;

use std::time::Duration;

use babel_idem::router::{Backoff, Jitter, Retry, RouterError};
use babel_idem::{Delivery, Disposition, Envelope, Router, urn};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::json;

const CREATED: &str = "urn:babel:orders:created";
/// Enough attempts for every retry below to be retried, never dead-lettered.
const MAX_ATTEMPTS: u64 = 64;

async fn fails(_: Envelope) -> Result<(), std::io::Error> {
    Err(std::io::Error::other("gateway timeout"))
}

fn router(backoff: Backoff) -> Router {
    Router::builder()
        .route(urn!("urn:babel:orders:created"), fails)
        .max_attempts(MAX_ATTEMPTS)
        .backoff(backoff)
        .build()
        .expect("a valid backoff")
}

/// The retry dispatch answers for a delivery made after `attempts_before`
/// attempts: its backoff is the one after failed attempt `attempts_before + 1`.
async fn retry_after(router: &Router, attempts_before: u64) -> Retry {
    let bytes = Envelope::new(CREATED, json!({"order_id": 7}))
        .with_attempts(attempts_before)
        .to_vec();
    match router.dispatch(&bytes, Delivery::new()).await {
        Disposition::Retry(retry) => retry,
        other => panic!("expected a retry, got {other}"),
    }
}

/// One parameter set of the family's backoff, in seconds as the Python SDK
/// takes them.
#[derive(Debug, Clone, Copy)]
struct Params {
    base_ms: u64,
    multiplier: f64,
    maximum_ms: u64,
}

impl Params {
    fn backoff(self) -> Backoff {
        Backoff::geometric(Duration::from_millis(self.base_ms))
            .with_multiplier(self.multiplier)
            .with_max(Duration::from_millis(self.maximum_ms))
    }

    fn base(self) -> f64 {
        self.base_ms as f64 / 1000.0
    }

    fn maximum(self) -> f64 {
        self.maximum_ms as f64 / 1000.0
    }

    /// The formula, as the Python SDK writes it.
    fn formula(self, n: u64) -> f64 {
        let delay = self.base() * self.multiplier.powf(n.saturating_sub(1) as f64);
        if self.maximum() > 0.0 {
            delay.min(self.maximum())
        } else {
            delay
        }
    }
}

/// Parameter sets drawn the same way every run (proptest's deterministic
/// runner): bases and caps in whole milliseconds (what a `Duration` built
/// from the same seconds keeps exactly), multipliers from 0 to 4, a cap of
/// zero in about a third of them, plus the Python SDK's defaults.
fn parameter_sets() -> Vec<Params> {
    let strategy = (
        0_u64..5_000,
        0.0_f64..4.0,
        prop_oneof![Just(0_u64), 1_u64..120_000],
    )
        .prop_map(|(base_ms, multiplier, maximum_ms)| Params {
            base_ms,
            multiplier,
            maximum_ms,
        });
    let mut runner = TestRunner::deterministic();
    let mut sets: Vec<Params> = (0..24)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    sets.push(Params {
        base_ms: 0,
        multiplier: 1.0,
        maximum_ms: 0,
    });
    sets.push(Params {
        base_ms: 1_500,
        multiplier: 1.0,
        maximum_ms: 0,
    });
    sets
}

/// Seconds equal to the nanosecond a `Duration` can hold, relative for
/// long delays.
fn close(delay: Duration, expected: f64) -> bool {
    (delay.as_secs_f64() - expected).abs() <= 1e-9_f64.max(expected * 1e-12)
}

#[tokio::test]
async fn the_delays_are_the_python_sdks_retry_delay() {
    let sets = parameter_sets();
    let attempts: Vec<u64> = (1..=12).collect();
    let requests: Vec<_> = sets
        .iter()
        .flat_map(|p| {
            attempts.iter().map(move |n| {
                json!({"n": n, "base": p.base(), "multiplier": p.multiplier, "maximum": p.maximum()})
            })
        })
        .collect();
    let python = family_python::ask(
        "the_delays_are_the_python_sdks_retry_delay",
        "retry-delay",
        &json!(requests),
    );
    let python: Option<Vec<f64>> = python.map(|answer| serde_json::from_value(answer).unwrap());

    let mut index = 0;
    for params in &sets {
        let router = router(params.backoff());
        for &n in &attempts {
            let retry = retry_after(&router, n - 1).await;
            assert_eq!(retry.attempts, n);
            let delay = retry.backoff.expect("the family's backoff always waits");
            let expected = params.formula(n);
            assert!(
                close(delay, expected),
                "{params:?}, n = {n}: {delay:?}, the formula says {expected}"
            );
            if let Some(python) = &python {
                assert!(
                    close(delay, python[index]),
                    "{params:?}, n = {n}: {delay:?}, Python's retry_delay says {}",
                    python[index]
                );
            }
            index += 1;
        }
    }
}

#[tokio::test]
async fn the_defaults_are_the_python_sdks_a_constant_base() {
    let backoff = Backoff::geometric(Duration::from_millis(750));
    let Backoff::Geometric {
        multiplier,
        max,
        jitter,
        ..
    } = backoff
    else {
        panic!("the family's form");
    };
    assert_eq!((multiplier, max, jitter), (1.0, None, Jitter::None));
    let router = router(backoff);
    for attempts_before in [0, 1, 5, 30] {
        let retry = retry_after(&router, attempts_before).await;
        assert_eq!(retry.backoff, Some(Duration::from_millis(750)));
    }
}

#[tokio::test]
async fn a_zero_max_leaves_the_delays_uncapped() {
    let router = router(
        Backoff::geometric(Duration::from_secs(1))
            .with_multiplier(3.0)
            .with_max(Duration::ZERO),
    );
    let retry = retry_after(&router, 9).await;
    assert_eq!(retry.backoff, Some(Duration::from_secs(3_u64.pow(9))));
}

#[test]
fn a_multiplier_that_names_no_delay_is_refused_when_built() {
    for multiplier in [-1.0, f64::NAN, f64::INFINITY] {
        let error = Router::builder()
            .backoff(Backoff::geometric(Duration::from_secs(1)).with_multiplier(multiplier))
            .build()
            .unwrap_err();
        assert!(
            matches!(error, RouterError::BackoffMultiplier { .. }),
            "{multiplier}: {error}"
        );
    }
    assert!(
        Router::builder()
            .backoff(Backoff::geometric(Duration::from_secs(1)).with_multiplier(0.0))
            .build()
            .is_ok()
    );
}

/// What one worker draws: a delay for each of `attempts`, on its own thread.
fn worker_delays(backoff: Backoff, attempts: u64) -> Vec<Duration> {
    std::thread::spawn(move || (1..=attempts).map(|n| backoff.delay(n).unwrap()).collect())
        .join()
        .unwrap()
}

#[test]
fn full_jitter_stays_within_the_ceiling_and_two_workers_draw_apart() {
    let backoff = Backoff::geometric(Duration::from_millis(200))
        .with_multiplier(2.0)
        .with_max(Duration::from_secs(30))
        .with_full_jitter();
    let attempts = 400;
    let first = worker_delays(backoff, attempts);
    let second = worker_delays(backoff, attempts);

    for (n, (a, b)) in (1..=attempts).zip(first.iter().zip(&second)) {
        let ceiling = backoff.ceiling(n).unwrap();
        assert!(
            *a <= ceiling && *b <= ceiling,
            "attempt {n}: {a:?}, {b:?} over {ceiling:?}"
        );
    }
    assert_ne!(first, second, "two workers drew the same sequence");

    // Spread over the whole interval: past the cap (attempt 9 on) every
    // ceiling is 30 s, so the draws there are uniform on [0, 30 s]; of 392
    // draws, fewer than a tenth in either quarter would be a broken draw
    // (a chance far below one in a million for a uniform one).
    let capped: Vec<f64> = first[9..]
        .iter()
        .chain(&second[9..])
        .map(|delay| delay.as_secs_f64() / 30.0)
        .collect();
    let low = capped.iter().filter(|x| **x < 0.25).count();
    let high = capped.iter().filter(|x| **x >= 0.75).count();
    let tenth = capped.len() / 10;
    assert!(
        low > tenth && high > tenth,
        "low {low}, high {high} of {}",
        capped.len()
    );
}

#[tokio::test]
async fn a_jittered_retry_asks_for_a_delay_within_the_ceiling() {
    let backoff = Backoff::geometric(Duration::from_secs(2))
        .with_multiplier(1.5)
        .with_full_jitter();
    let router = router(backoff);
    for attempts_before in 0..10 {
        let retry = retry_after(&router, attempts_before).await;
        let ceiling = backoff.ceiling(attempts_before + 1).unwrap();
        assert!(retry.backoff.is_some_and(|delay| delay <= ceiling));
    }
}
