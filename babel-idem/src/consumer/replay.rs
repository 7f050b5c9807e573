//! Intended replays: the `bq-replay-bypass` transport header
//! ([`Delivery::is_replay`](crate::Delivery::is_replay) reads it), seen from
//! a handler as [`is_replay`].

use std::future::Future;

use crate::guard::context;

pub use crate::router::HEADER_REPLAY_BYPASS;

/// Whether the delivery being handled is an intended replay: it carried the
/// `bq-replay-bypass` header with a non-empty value. `false` outside a
/// [`Consumer`](crate::consumer::Consumer)'s dispatch, and in tasks a handler spawns
/// (the flag is the delivery's context's, current only while the delivery's
/// own future is polled).
///
/// ```
/// assert!(!babel_idem::consumer::is_replay());
/// ```
pub fn is_replay() -> bool {
    context::is_replay()
}

/// Runs an external, non-idempotent effect (an email, a card charge, a call
/// to a third party) unless the delivery is an intended replay, in which
/// case it returns `None` without running it: a replay re-runs the handler's
/// idempotent core but does not fire again what already fired. The other
/// SDKs' `bypass_external_effects`.
///
/// ```
/// use babel_idem::consumer::bypass_external_effects;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// // Outside a replay the effect runs.
/// let sent = bypass_external_effects(|| async { "email sent" }).await;
/// assert_eq!(sent, Some("email sent"));
/// # });
/// ```
pub async fn bypass_external_effects<F, Fut>(effect: F) -> Option<Fut::Output>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    if is_replay() {
        return None;
    }
    Some(effect().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_flag_holds_inside_the_scope_only() {
        assert!(!is_replay());
        let replay = context::DeliveryContext::new(None, None, true);
        let (inside, _) = context::scope(replay, async {
            let skipped = bypass_external_effects(|| async { 1 }).await;
            (is_replay(), skipped)
        })
        .await;
        assert_eq!(inside, (true, None));
        assert!(!is_replay());
    }
}
